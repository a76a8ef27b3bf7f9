"""Cost of a step handed out partial (a rank never reached it: hung, lost) at large worlds: the
merger's ``expire`` and the detector's scoring of what it hands out, beside another revision's
merger in the same run.

    python bench/partial_steps.py [--ranks 4096,100000] [--steps 6] [--baseline REV]

Each world's ranks send relay-shaped ``RanksBlock`` frames (8 ranks per node, 8 metrics) of
every step but for one rank, so every step closes partial past its grace; per step the CPU ms of
``StepMerger.expire`` and of ``DivergenceDetector.update_many`` on its output, median over
``--steps`` after two warm-up steps. ``--baseline REV``: that revision's
``aggregator/merge.py`` (``git show``) with its own detector, timed first.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import time
from typing import Any

from rankwatch.agent.wire.records import RanksBlock
from rankwatch.aggregator import merge as this_tree
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from revision import module_at

METRICS = ("loss", "lr", "throughput", "step_time", "grad_norm", "grad_norm_local", "data_time",
           "loss_scale")  # fmt: skip
WARM_STEPS = 2


def blocks(world: int, step: int, rng: random.Random) -> list[RanksBlock]:
    out = []
    for lo in range(0, world, 8):
        ranks = [r for r in range(lo, min(world, lo + 8)) if r != world // 2]  # one hung
        n = len(ranks)
        out.append(RanksBlock(
            "run", world, ranks, [step + 1] * n, [0.0] * n, ["node"] * n, [1] * n, [step] * n,
            [None] * n, {m: [rng.gauss(1.0, 0.1) for _ in ranks] for m in METRICS}, [0] * n,
        ))  # fmt: skip
    return out


def timed(module: Any, world: int, steps: int) -> tuple[float, float]:
    rng = random.Random(0)
    merger, detector = module.StepMerger(grace_s=5.0), DivergenceDetector()
    expire, score = [], []
    for step in range(WARM_STEPS + steps):
        for block in blocks(world, step, rng):
            merger.add_ranks(block, float(step))
        t = time.process_time()
        out = merger.expire(float(step) + 10.0)
        t1 = time.process_time()
        detector.update_many(out)
        t2 = time.process_time()
        if step >= WARM_STEPS:
            expire.append(t1 - t)
            score.append(t2 - t1)
    return statistics.median(expire) * 1e3, statistics.median(score) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4096,100000", help="world sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--baseline", help="revision whose merge.py is timed beside this tree's")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.ranks.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--ranks: whole numbers, comma-separated, got {args.ranks!r}")
    if not sizes or min(sizes) < 16 or args.steps < 1:
        ap.error("--ranks: at least 16 each; --steps: at least 1")
    versions: list[tuple[str, Any]] = [("this tree", this_tree)]
    if args.baseline:
        try:
            before = module_at(args.baseline, "aggregator/merge.py")
            # its steps as this tree's types, so that the detector takes both the same way
            before.StepValues, before.StepGrid = this_tree.StepValues, this_tree.StepGrid
            versions.insert(0, (args.baseline, before))
        except subprocess.CalledProcessError as exc:
            ap.error(f"--baseline {args.baseline}: {exc.stderr.strip()}")
    print(f"partial_steps: CPU ms per partial step of {len(METRICS)} metrics, median of "
          f"{args.steps}")  # fmt: skip
    print(f"{'ranks':>7} {'version':>10} {'expire':>8} {'score':>8} {'total':>8} {'ratio':>6}")
    for world in sizes:
        first = None
        for name, module in versions:
            expire, score = timed(module, world, args.steps)
            total = expire + score
            first = first or total
            print(f"{world:>7,} {name:>10} {expire:>8.1f} {score:>8.1f} {total:>8.1f} "
                  f"{total / first:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
