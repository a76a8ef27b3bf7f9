"""PyTorch DistributedDataParallel on CPU (gloo), watched by rankwatch.

Run as is (2 ranks on one machine)::

    rankwatch serve &                      # the aggregator and dashboard (http://127.0.0.1:8670)
    torchrun --nproc-per-node=2 examples/torch_ddp.py --steps 200

Every rank finds the aggregator by itself: ``RANKWATCH_ADDR`` if set, else ``MASTER_ADDR`` (set
by torchrun) at the default ingest port 8671. The lines marked ``# rankwatch`` are all it takes;
the fourth one (optional) records each rank's own gradient norm before DDP's all-reduce, the
number that tells a bad rank apart (after the all-reduce every rank holds the same gradients).
The last two (optional) let the aggregator checkpoint and stop the job by policy
(``rankwatch serve --policy stop-on-nan``) when the ranks opt in with
``RANKWATCH_ACCEPT=checkpoint,stop``: every rank saves and leaves after the same step
(docs/actions.md).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from rankwatch.agent import Monitor  # rankwatch
from rankwatch.agent.torch import install_local_grad_norm_hook
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
CLASSES = 5
BATCH_PER_RANK = 32


def batch(generator: torch.Generator, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of this rank's shard: inputs and the labels a fixed random teacher gives them."""
    x = torch.randn(BATCH_PER_RANK, FEATURES, generator=generator)
    return x, (x @ teacher).argmax(dim=1)


def save(model: nn.Module, rank: int, step: int) -> str:
    """This rank's weights after ``step`` (a checkpoint the aggregator asked for)."""
    folder = Path(os.environ.get("RANKWATCH_LOG_DIR", ".")) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}-step{step}.pt"
    torch.save(model.state_dict(), path)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights and teacher on every rank
    teacher = torch.randn(FEATURES, CLASSES)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard

    with Monitor(batch_size=BATCH_PER_RANK) as mon:  # rankwatch
        install_local_grad_norm_hook(model, mon)  # rankwatch (optional: per-rank grad norm)
        mon.on("checkpoint", lambda step: save(model.module, rank, step))  # rankwatch (optional)
        for step in range(1, args.steps + 1):
            x, y = batch(generator, teacher)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            mon.log(step, loss=loss.item(), lr=optimizer.param_groups[0]["lr"])  # rankwatch
            if mon.should_stop(step):  # rankwatch (optional: a stop every rank agreed on)
                break
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
    dist.barrier()  # leave together: gloo aborts a rank torn down while another still talks
    dist.destroy_process_group()
    print(f"rank {rank}: finished after step {step} of {args.steps}", flush=True)


if __name__ == "__main__":
    main()
