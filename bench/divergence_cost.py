"""Cost of scoring one (run, metric, step) across ranks, and the false-flag rate at scale.

    python bench/divergence_cost.py [--steps 2000] [--false-flag-steps 1000] [--seeds 5]

Cost: ``DivergenceDetector.update`` on one step of seeded gaussian noise at 8, 64, 1,024 and
4,096 ranks (the StepValues are built beforehand, as the merger hands them over), after a
warm-up; median and p95 in microseconds. Baselines, measured in the same run on the same values:
a plain ``np.median`` of the array, and for worlds scored on lists (ranks below
``PY_MAX_RANKS``) the numpy path on the same steps, and the same steps with the window-sum test
off (``window_steps = 0``: the CUSUM alone). Rate: at 5 steps/s and 6 metrics a run needs
30 updates per second; the aggregator's ingest needs one update per metric per step of a run.

False flags: 1,024 ranks of clean gaussian noise (5 % relative), ``--false-flag-steps`` steps for
each of ``--seeds`` seeds; every new divergence is a false flag. Also the detection latency of a
rank shifted by 3 and by 4 sigma (steps from onset to flag; ranks 0, 103, 206, ...).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from rankwatch.aggregator.divergence import detector as divergence
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.merge import StepValues

WARMUP_STEPS = 50
SIGMA = 0.05  # relative noise across ranks
MU = 2.0
UPDATES_PER_S = 5 * 6  # 5 steps/s x 6 metrics


def steps_of(n: int, count: int, seed: int) -> list[StepValues]:
    rng = np.random.default_rng(seed)
    data = MU * (1 + SIGMA * rng.standard_normal((count, n)))
    return [
        StepValues("bench", "loss", i, dict(enumerate(row.tolist())), n, True)
        for i, row in enumerate(data)
    ]


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def timed_updates(svs: list[StepValues], config: DivergenceConfig | None = None) -> list[float]:
    """Microseconds per update after the warm-up, on a fresh detector."""
    det = DivergenceDetector(config)
    out = []
    for i, sv in enumerate(svs):
        t0 = time.perf_counter()
        det.update(sv)
        if i >= WARMUP_STEPS:
            out.append((time.perf_counter() - t0) * 1e6)
    return out


def cost(n: int, count: int) -> None:
    svs = steps_of(n, count + WARMUP_STEPS, seed=n)
    update_us = timed_updates(svs)
    median_us = []
    for sv in svs[WARMUP_STEPS:]:
        arr = np.fromiter(sv.values.values(), np.float64, n)
        t0 = time.perf_counter()
        np.median(arr)
        median_us.append((time.perf_counter() - t0) * 1e6)
    med_u, med_b = statistics.median(update_us), statistics.median(median_us)
    line = (
        f"{n:5d} ranks: update median {med_u:7.1f} us  p95 {p95(update_us):7.1f} us | "
        f"np.median median {med_b:6.1f} us | ratio {med_u / med_b:4.1f}x | "
        f"CPU at {UPDATES_PER_S} updates/s: {med_u * UPDATES_PER_S / 1e4:.3f} %"
    )
    # the window-sum test's share: the same steps with it off (the CUSUM alone)
    off_us = statistics.median(timed_updates(svs, DivergenceConfig(window_steps=0)))
    line += f" | window test off {off_us:6.1f} us ({med_u / off_us:.2f}x with it)"
    if n <= divergence.PY_MAX_RANKS:  # scored on lists: also time the numpy path
        saved, divergence.PY_MAX_RANKS = divergence.PY_MAX_RANKS, 0
        try:
            numpy_us = statistics.median(timed_updates(svs))
        finally:
            divergence.PY_MAX_RANKS = saved
        line += f" | numpy path {numpy_us:6.1f} us ({numpy_us / med_u:.1f}x the lists)"
    print(line)


def false_flags(count: int, seeds: int) -> None:
    n, flagged = 1_024, 0
    for seed in range(seeds):
        det = DivergenceDetector()
        for sv in steps_of(n, count, seed=1_000 + seed):
            flagged += len(det.update(sv).new)
    rank_steps = n * count * seeds
    print(
        f"false flags: {flagged} in {rank_steps:,} rank-steps of clean noise "
        f"({flagged / rank_steps * 1e6:.2f} per million)"
    )


def latency(shift_sigma: float, seeds: int) -> None:
    n, onset, drifting = 1_024, 10, list(range(0, 1_024, 103))
    lat = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        data = MU * (1 + SIGMA * rng.standard_normal((onset + 20, n)))
        data[onset:, drifting] += MU * SIGMA * shift_sigma
        det, first = DivergenceDetector(), {}
        for i, row in enumerate(data):
            for d in det.update(
                StepValues("b", "loss", i, dict(enumerate(row.tolist())), n, True)
            ).new:
                first.setdefault(d.rank, i - onset + 1)  # 1 = flagged on the onset step
        lat += [first.get(r, 99) for r in drifting]
    within5 = sum(x <= 5 for x in lat) / len(lat)
    print(
        f"{shift_sigma:g}-sigma shift: flagged within 5 steps {within5:.1%}, median "
        f"{statistics.median(lat):g} steps, worst {max(lat)} ({len(lat)} drifting ranks)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2_000, help="timed steps per size")
    ap.add_argument("--false-flag-steps", type=int, default=1_000)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    for n in (8, 64, 1_024, 4_096):
        cost(n, args.steps)
    false_flags(args.false_flag_steps, args.seeds)
    for shift in (3.0, 4.0):
        latency(shift, 4 * args.seeds)


if __name__ == "__main__":
    main()
