"""examples/hf_trainer.py with each rank's losses computed a second way, for the e2e test.

The example runs unchanged except that its model gets a forward hook: every training forward's
summed token loss is computed again from the logits and labels (float64, shifted as for a
causal LM). A step's value is that sum over its micro-batches divided by its label count, as the
Trainer normalises (``num_items_in_batch``: every label, though the shift leaves the last of each
sequence unscored; its mean over the ranks, times the ranks, is this rank's count, as all
sequences have one length). Each rank writes
``expected_rank<k>.json`` into ``EXPECT_DIR``; rank 0 also the Trainer's ``log_history``.
Run by torchrun: ``torchrun --nproc-per-node=2 tests/e2e/hf_job.py --steps 6``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    example = load_example()
    torch = example.torch
    micro: list[tuple[float, int]] = []  # (summed token loss, labels) per training forward
    trainers: list[Any] = []

    def own_loss(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if module.training:
            logits = output.logits.detach().double()[:, :-1]
            labels = kwargs["labels"][:, 1:]
            flat = logits.reshape(-1, logits.shape[-1])
            loss = torch.nn.functional.cross_entropy(flat, labels.reshape(-1), reduction="sum")
            micro.append((float(loss), int(kwargs["labels"].numel())))

    build = example.build

    def build_checked(args: Any) -> Any:
        trainer = build(args)
        trainer.model.register_forward_hook(own_loss, with_kwargs=True)
        trainers.append(trainer)
        return trainer

    example.build = build_checked
    example.main()
    trainer = trainers[0]
    per_step = trainer.args.gradient_accumulation_steps
    steps = [micro[i : i + per_step] for i in range(0, len(micro), per_step)]
    expected = {i + 1: sum(x for x, _ in s) / sum(n for _, n in s) for i, s in enumerate(steps)}
    out = Path(os.environ["EXPECT_DIR"])
    rank = trainer.args.process_index
    (out / f"expected_rank{rank}.json").write_text(json.dumps(expected), encoding="utf-8")
    if rank == 0:
        history = json.dumps(trainer.state.log_history)
        (out / "log_history.json").write_text(history, encoding="utf-8")


if __name__ == "__main__":
    main()
