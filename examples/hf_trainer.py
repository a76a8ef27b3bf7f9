"""A Hugging Face ``Trainer`` on CPU under torchrun (2 processes, gloo), watched by rankwatch.

The model is a 2-layer GPT-2 built from a config (nothing is downloaded), trained on random
token ids::

    rankwatch serve &                      # the aggregator and dashboard (http://127.0.0.1:8670)
    torchrun --nproc-per-node=2 examples/hf_trainer.py --steps 100

The line marked ``# rankwatch`` is all it takes: every rank records its own ``loss`` (the
Trainer logs only the mean over the processes), ``lr``, the Trainer's ``grad_norm``, its own
``grad_norm_local`` (before DDP's all-reduce), ``step_time``, ``throughput`` and the
``eval_*`` metrics.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from rankwatch.agent.hf import watch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB = 64
SEQ_LEN = 16
BATCH_PER_RANK = 4


class RandomTokens(Dataset):
    """``count`` sequences of random token ids; the labels are the inputs (causal LM)."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (count, SEQ_LEN), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build(args: argparse.Namespace) -> Trainer:
    """The Trainer, with nothing of rankwatch in it."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    world = int(os.environ.get("WORLD_SIZE", "1"))
    samples = args.steps * args.accumulation * BATCH_PER_RANK * world
    training = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="hf_trainer_"),
        max_steps=args.steps,
        per_device_train_batch_size=BATCH_PER_RANK,
        per_device_eval_batch_size=BATCH_PER_RANK,
        gradient_accumulation_steps=args.accumulation,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=args.eval_every,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
        seed=0,
    )
    return Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=RandomTokens(samples, seed=1),
        eval_dataset=RandomTokens(2 * BATCH_PER_RANK * world, seed=2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--accumulation", type=int, default=1, help="gradient accumulation")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()

    trainer = build(args)
    watch(trainer)  # rankwatch
    trainer.train()
    print(f"rank {trainer.args.process_index}: finished {trainer.state.global_step} steps")


if __name__ == "__main__":
    main()
