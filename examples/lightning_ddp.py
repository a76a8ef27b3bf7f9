"""PyTorch Lightning DDP on CPU (2 processes, gloo), watched by rankwatch.

Run as is (Lightning starts the second rank itself)::

    rankwatch serve &                      # the aggregator and dashboard (http://127.0.0.1:8670)
    python examples/lightning_ddp.py --steps 200
    python examples/lightning_ddp.py --steps 200 --corrupt-rank 1   # rank 1 gets wrong labels

The line marked ``# rankwatch`` is all it takes: every rank records its own ``loss``, its own
``self.log`` values (``train_acc``, ``val_loss``), ``lr``, ``step_time``, ``throughput`` and
``grad_norm_local`` (its gradient norm before DDP's all-reduce). Lightning's loggers run on
rank 0 only and would show none of that per rank. With ``--corrupt-rank`` the dashboard flags
that rank a few steps after ``--corrupt-from``.
"""

from __future__ import annotations

import argparse
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from rankwatch.agent.lightning import RankwatchCallback
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 16
CLASSES = 5
BATCH_PER_RANK = 32
VAL_BATCHES = 2


class TeacherBatches(Dataset):
    """Batch ``i`` of rank ``rank``'s shard: inputs and the labels a fixed random teacher gives
    them (from batch ``corrupt_from`` on, when ``corrupt``, the next class's label instead)."""

    def __init__(self, steps: int, rank: int, corrupt: bool = False, corrupt_from: int = 0) -> None:
        self.steps, self.rank, self.corrupt, self.corrupt_from = steps, rank, corrupt, corrupt_from
        self.teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(1000 * (self.rank + 1) + i)
        x = torch.randn(BATCH_PER_RANK, FEATURES, generator=generator)
        y = (x @ self.teacher).argmax(dim=1)
        if self.corrupt and i >= self.corrupt_from:
            y = (y + 1) % CLASSES
        return x, y


class Classifier(pl.LightningModule):
    def __init__(self, steps: int, corrupt_rank: int, corrupt_from: int) -> None:
        super().__init__()
        self.steps, self.corrupt_rank, self.corrupt_from = steps, corrupt_rank, corrupt_from
        torch.manual_seed(0)  # the same initial weights on every rank
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        self.log("train_acc", (logits.argmax(dim=1) == y).float().mean(), on_step=True)
        return F.cross_entropy(logits, y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))  # this rank's own, per epoch

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        corrupt = self.global_rank == self.corrupt_rank
        shard = TeacherBatches(self.steps, self.global_rank, corrupt, self.corrupt_from)
        return DataLoader(shard, batch_size=None, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TeacherBatches(VAL_BATCHES, 100 + self.global_rank), batch_size=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--val-every", type=int, default=10, help="steps between validations")
    parser.add_argument("--corrupt-rank", type=int, default=-1, help="rank fed wrong labels")
    parser.add_argument("--corrupt-from", type=int, default=10, help="first corrupted step")
    args = parser.parse_args()
    # val_loss is meant per rank (rankwatch compares the ranks' own): not a mistake here.
    warnings.filterwarnings("ignore", ".*sync_dist=True.*when logging on epoch level")

    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=args.devices,
        max_steps=args.steps,
        val_check_interval=args.val_every,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # each rank reads its own shard (TeacherBatches)
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RankwatchCallback()],  # rankwatch
    )
    trainer.fit(Classifier(args.steps, args.corrupt_rank, args.corrupt_from))
    print(f"rank {trainer.global_rank}: finished {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
