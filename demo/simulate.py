"""Synthetic ranks for `rankwatch demo --simulate` and for tests without MindSpore.

Each rank is its own process running a real ``rankwatch.agent.Monitor``, so records take the
same path as a real job's: JSONL fallback, sender thread, ZeroMQ, aggregator. The loss curves are
shaped like the real 4-rank msrun traces in tests/fixtures (a decaying loss, healthy ranks within
about ±15 % of each other, the corrupted-labels rank at about 3× the others).

Unlike ranks of a real data-parallel job there is no collective between simulated ranks: a slow
or hung rank falls behind the others instead of holding them back. Like msrun, ``SimulatedJob``
kills the remaining ranks once one fails.

Run one rank by hand (rank and world size also come from ``RANK``/``WORLD_SIZE`` or msrun's
variables, the aggregator address from ``RANKWATCH_ADDR``, ``MASTER_ADDR`` or ``MS_SCHED_HOST``)::

    python -m rankwatch.demo.simulate --rank 0 --world-size 2 --steps 100
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

FAULTS = ("labels", "nan", "slow", "hang", "crash", "sdc", "none")
BATCH_SIZE = 32
LOSS_START = 1.6  # loss at step 0, about the real traces' first step
LOSS_FLOOR = 0.55
LOSS_DECAY_STEPS = 25.0
NOISE_REL = 0.06  # per-rank relative noise of a healthy rank's loss
LABELS_FACTOR = 3.0  # corrupted labels: loss about 3x the median
LABELS_DRAG = 1.15  # healthy ranks are dragged up by the shared gradient
GRAD_NORM_START = 2.0
SDC_FACTOR = 1.5  # silent data corruption: the bad rank's gradients, as the real job's default
SLOW_EXTRA_S = 0.5  # extra seconds per step on the slow rank
HANG_SLEEP_S = 3600.0
KILL_POLL_S = 0.2  # how often SimulatedJob looks at its ranks


def synthetic_step(
    rank: int, step: int, fault: str, fault_rank: int, fault_step: int, rng: random.Random
) -> dict[str, float]:
    """The metrics of one rank at one step (1-based), fault included."""
    clean = LOSS_FLOOR + (LOSS_START - LOSS_FLOOR) * math.exp(-step / LOSS_DECAY_STEPS)
    loss = clean * (1.0 + rng.gauss(0.0, NOISE_REL))
    grad_norm = GRAD_NORM_START * math.sqrt(clean / LOSS_START) * (1.0 + rng.gauss(0.0, 0.05))
    faulty = step >= fault_step
    if fault == "labels" and faulty:
        if rank == fault_rank:
            loss *= LABELS_FACTOR
            grad_norm *= 2.0
        else:
            loss *= LABELS_DRAG
    elif fault == "nan" and (
        (rank == fault_rank and faulty) or step > fault_step  # NaN spreads one step later
    ):
        loss, grad_norm = math.nan, math.nan
    elif fault == "sdc" and faulty and rank == fault_rank:
        grad_norm *= SDC_FACTOR  # its own gradients only: the loss is like everyone's
    return {"loss": loss, "grad_norm": grad_norm}


def run_rank(args: argparse.Namespace) -> None:
    """One simulated rank: log ``args.steps`` steps through a real Monitor."""
    from rankwatch.agent.monitor import Monitor

    with Monitor(rank=args.rank, world_size=args.world_size, batch_size=BATCH_SIZE) as mon:
        rank = mon.rank
        rng = random.Random(args.seed * 1000 + rank)
        bad = rank == args.fault_rank
        for step in range(1, args.steps + 1):
            if bad and step >= args.fault_step:
                if args.fault == "crash":
                    raise RuntimeError(f"injected fault: rank {rank} crashed at step {step}")
                if args.fault == "hang" and step == args.fault_step:
                    print(f"rank {rank}: injected hang at step {step}", flush=True)
                    while True:
                        time.sleep(HANG_SLEEP_S)
                if args.fault == "slow":
                    time.sleep(args.slow_s)
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
            metrics = synthetic_step(rank, step, args.fault, args.fault_rank, args.fault_step, rng)
            mon.log(step, epoch=0, **metrics)
    print(f"rank {rank}: finished {args.steps} steps", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one simulated rank (see module docstring)")
    parser.add_argument("--rank", type=int, default=None, help="default: from the launcher env")
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--fault", choices=FAULTS, default="labels")
    parser.add_argument("--fault-rank", type=int, default=2)
    parser.add_argument("--fault-step", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--slow-s", type=float, default=SLOW_EXTRA_S)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    return args


def rank_command(rank: int, world_size: int, options: Mapping[str, object]) -> list[str]:
    """The command line of one simulated rank; ``options`` are this module's flags."""
    cmd = [sys.executable, "-m", "rankwatch.demo.simulate"]
    cmd += ["--rank", str(rank), "--world-size", str(world_size)]
    for name, value in options.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd


class SimulatedJob:
    """``world_size`` rank processes, stopped together like msrun stops its workers."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self.failed: int | None = None  # the rank that failed first

    def poll(self) -> int | None:
        """None while running; else 0 when all ranks succeeded, 1 after a failure."""
        codes = [p.poll() for p in self.procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and self.failed is None:
                self.failed = rank
                self._kill_others()  # as msrun does, with SIGKILL: no cleanup on the others
        if any(code is None for code in codes):
            return None
        return 0 if self.failed is None else 1

    def wait(self, timeout_s: float | None = None) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(KILL_POLL_S)
        return code

    def _kill_others(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run_rank(args)
    except RuntimeError as exc:
        print(f"{exc}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
