"""A hand-written training loop with Hugging Face Accelerate on CPU, watched by rankwatch.

Run as is (2 processes, gloo)::

    rankwatch serve &                      # the aggregator and dashboard (http://127.0.0.1:8670)
    accelerate launch --multi_gpu --num_processes=2 --num_machines=1 --mixed_precision=no \\
        --dynamo_backend=no examples/accelerate_loop.py --steps 200

Nothing Accelerate-specific is needed: ``accelerate launch`` starts the ranks through torchrun's
launcher, which puts ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``TORCHELASTIC_RUN_ID`` in each
one's environment, and the plain ``Monitor`` takes its rank, world size, shared run name and
aggregator address from there. The lines marked ``# rankwatch`` are all it takes; the second
(optional) records each rank's gradient norm before the all-reduce of the DDP model
``accelerator.prepare`` made.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from rankwatch.agent import Monitor  # rankwatch
from rankwatch.agent.torch import try_local_grad_norm_hook
from torch import nn

FEATURES = 16
CLASSES = 5
BATCH_PER_RANK = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)  # the same initial weights and teacher on every rank
    teacher = torch.randn(FEATURES, CLASSES)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(1000 + accelerator.process_index)  # own shard
    loss_fn = nn.CrossEntropyLoss()

    with Monitor(batch_size=BATCH_PER_RANK) as mon:  # rankwatch
        try_local_grad_norm_hook(model, mon)  # rankwatch (optional: per-rank grad norm)
        for step in range(1, args.steps + 1):
            x = torch.randn(BATCH_PER_RANK, FEATURES, generator=generator)
            y = (x @ teacher).argmax(dim=1)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            mon.log(step, loss=loss.item(), lr=optimizer.param_groups[0]["lr"])  # rankwatch
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index}: finished {args.steps} steps", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
