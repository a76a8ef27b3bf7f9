"""Detection quality of the divergence detector on 1,024 simulated ranks (no sockets).

    python bench/detection_quality.py [--ranks 1024] [--trials 20] [--clean-steps 1000] [--seeds 5]
                                      [--evidence-per-doubling X] [--window-steps W]
                                      [--sigmas 1,2,3,4,5] [--first-trial K]

Values come from the load generator's model (``bench/loadgen.py``: loss decaying with 5 % relative
per-rank noise, the ``sigma`` of the faults) and are fed straight to
``rankwatch.aggregator.divergence.detector.DivergenceDetector`` as ``StepValues``, one metric per
step, as the merger hands them over.

* Recall and delay: per fault size (drift of 1..5 sigma in the loss, a NaN), ``--trials`` runs
  with ``FAULTY`` drifting ranks from step ``ONSET``; delay = steps from the onset to the flag
  (1 = flagged on the onset step). Recall = share flagged within 5 steps. A 20-sigma spike on one
  step only must not be flagged.
* False flags: ``--seeds`` clean runs of ``--clean-steps`` steps, all five metrics (loss, lr,
  throughput, step_time, grad_norm); every new divergence is false. Per 1,000,000 rank-steps.
* ``--evidence-per-doubling``: the detector's setting of that name (0: the same CUSUM limit at
  every world size, as before it grew with the ranks); ``--window-steps``: the window-sum
  test's window (0: off, the CUSUM alone, as before it).
* Beside each drift row: the ceiling at this world size, a test that knows the onset and sums
  the 5 z-scores, two-sided, at the budget's false-flag rate per rank, step and metric
  (``alpha``: 0.1 false alarms per run-hour at 1 step/s, 5 metrics), the share of it reached,
  a 95 % (Wilson) interval of the recall, and the delay distribution (share of faulty ranks
  flagged at delay 1, 2, ..., 8, later).
* Baseline, on the same values: flag a rank after 3 consecutive steps with robust
  ``|z| = |x - median| / (1.4826 MAD) >= 3`` (the usual "k steps over a threshold" rule).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from statistics import NormalDist

import numpy as np
from loadgen import METRICS, Fault, Model
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import MAD_TO_SIGMA, DivergenceDetector
from rankwatch.aggregator.merge import StepValues

ONSET = 30  # faults start here: the detector has seen 29 clean steps
WINDOW = 30  # steps observed from the onset
FAULTY = 16  # drifting ranks per trial (spread over the ranks)
WITHIN = 5  # "detected within 5 steps"
RATE = 5.0  # steps/s of the model (only step_time and throughput depend on it)
BASE_Z = 3.0  # baseline threshold ...
BASE_STEPS = 3  # ... held this many consecutive steps
RUN = "quality"
BUDGET_PER_HOUR = DivergenceConfig.alarms_per_hour  # false alarms per run-hour on clean data ...
STEPS_PER_HOUR = 3600  # ... at 1 step/s, every default metric scored
HISTOGRAM = 8  # delays shown one by one, then "later"


def alpha(n: int) -> float:
    """The budget per rank, step and metric in a world of ``n`` ranks."""
    return BUDGET_PER_HOUR / (STEPS_PER_HOUR * n * len(METRICS))


def ceiling(a: float, shift: float, window: int = WITHIN) -> float:
    """P(flag) of the test that knows the onset and sums the ``window`` z-scores from it,
    two-sided at ``a``, for a shift of ``shift`` sigma (z ~ N(shift, 1))."""
    n01 = NormalDist()
    t = n01.inv_cdf(1 - a / 2) * math.sqrt(window)
    return 1 - n01.cdf((t - shift * window) / math.sqrt(window))


def wilson(hits: int, n: int) -> tuple[float, float]:
    """95 % interval of a share."""
    p, z = hits / n, 1.96
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mid - half, mid + half


def histogram(delays: list[int | None]) -> str:
    n = len(delays)
    counts = [sum(d == k for d in delays) for k in range(1, HISTOGRAM + 1)]
    later = n - sum(counts)
    return " ".join(f"{c / n:.3f}" for c in counts) + f" | later {later / n:.3f}"


class Baseline:
    """|robust z| >= BASE_Z on BASE_STEPS consecutive steps, per (metric, rank)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.streak: dict[str, np.ndarray] = {}
        self.flagged: dict[str, np.ndarray] = {}

    def update(self, metric: str, values: np.ndarray) -> np.ndarray:
        """Ranks newly flagged at this step."""
        finite = np.isfinite(values)
        med = np.median(values[finite]) if finite.any() else 0.0
        mad = np.median(np.abs(values[finite] - med)) if finite.any() else 0.0
        scale = max(MAD_TO_SIGMA * mad, 1e-12)
        with np.errstate(invalid="ignore"):
            over = ~finite | (np.abs(values - med) / scale >= BASE_Z)
        streak = self.streak.setdefault(metric, np.zeros(self.world, np.int64))
        flagged = self.flagged.setdefault(metric, np.zeros(self.world, bool))
        streak[:] = np.where(over, streak + 1, 0)
        new = (streak >= BASE_STEPS) & ~flagged
        flagged |= new
        flagged &= streak > 0  # resolved once back under the threshold
        return np.flatnonzero(new)


def step_values(metric: str, step: int, arr: np.ndarray) -> StepValues:
    n = len(arr)
    return StepValues(RUN, metric, step, dict(zip(range(n), arr.tolist(), strict=True)), n, True)


def faulty_ranks(world: int) -> list[int]:
    stride = world // FAULTY
    return [7 % stride + i * stride for i in range(FAULTY)]  # 7, 7 + stride, ... inside the world


def fault_trial(
    world: int, kind: str, sigma: float | None, seed: int, config: DivergenceConfig
) -> dict[str, object]:
    """Delays (or None) of the faulty ranks, for rankwatch and the baseline; collateral flags."""
    bad = faulty_ranks(world)
    model = Model(world, RATE, seed, [Fault(kind, r, sigma, ONSET) for r in bad])
    det, base = DivergenceDetector(config), Baseline(world)
    first: dict[int, int] = {}
    base_first: dict[int, int] = {}
    collateral = base_collateral = 0
    bad_set = set(bad)
    ranks = np.arange(world, dtype=np.int64)
    for step in range(1, ONSET + WINDOW):
        loss = model.values(step)["loss"]
        for d in det.update_array(RUN, "loss", step, ranks, loss, world).new:
            if d.rank in bad_set and step >= ONSET:
                first.setdefault(d.rank, step - ONSET + 1)
            else:
                collateral += 1
        for rank in base.update("loss", loss).tolist():
            if rank in bad_set and step >= ONSET:
                base_first.setdefault(rank, step - ONSET + 1)
            else:
                base_collateral += 1
    return {
        "ours": [first.get(r) for r in bad],
        "base": [base_first.get(r) for r in bad],
        "collateral": collateral,
        "base_collateral": base_collateral,
    }


def within(delays: list[int | None]) -> float:
    return sum(d is not None and d <= WITHIN for d in delays) / len(delays)


def describe(delays: list[int | None]) -> str:
    """within-5 share, median and p95 delay, share flagged within the window."""
    ordered = sorted(WINDOW + 1 if d is None else d for d in delays)  # WINDOW + 1: never flagged

    def show(x: float) -> str:
        return f">{WINDOW}" if x > WINDOW else f"{x:g}"

    n = len(ordered)
    within = sum(d <= WITHIN for d in ordered) / n
    flagged = sum(d <= WINDOW for d in ordered) / n
    median, p95 = statistics.median(ordered), ordered[int(0.95 * (n - 1))]
    return f"{within:7.1%} {show(median):>6} {show(p95):>6} {flagged:6.1%}"


def false_flags(
    world: int, steps: int, seeds: int, config: DivergenceConfig
) -> tuple[int, int, dict[str, int], float]:
    """(ours, baseline, ours by metric, seconds per update) over seeds x steps x world."""
    ours = base_total = 0
    by_metric = dict.fromkeys(METRICS, 0)
    spent, updates = 0.0, 0
    for seed in range(seeds):
        model = Model(world, RATE, 10_000 + seed, [])
        det, base = DivergenceDetector(config), Baseline(world)
        for step in range(1, steps + 1):
            values = model.values(step)
            for metric in METRICS:
                sv = step_values(metric, step, values[metric])
                t0 = time.perf_counter()
                new = det.update(sv).new
                spent += time.perf_counter() - t0
                updates += 1
                ours += len(new)
                by_metric[metric] += len(new)
                base_total += len(base.update(metric, values[metric]))
    return ours, base_total, by_metric, spent / max(updates, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=20, help="runs per fault size")
    ap.add_argument("--clean-steps", type=int, default=1000, help="steps per clean run")
    ap.add_argument("--seeds", type=int, default=5, help="clean runs (0: none)")
    ap.add_argument(
        "--sigmas", default="1,2,3,4,5", help="drift rows, in sigma (NaN and spike rows too)"
    )
    ap.add_argument("--first-trial", type=int, default=0, help="seed of the first trial")
    ap.add_argument(
        "--evidence-per-doubling",
        type=float,
        default=DivergenceConfig.evidence_per_doubling,
        help="CUSUM limit added per doubling of the ranks (0: one limit at every world size)",
    )
    ap.add_argument(
        "--window-steps",
        type=int,
        default=DivergenceConfig.window_steps,
        help="window of the window-sum test (0: off, the CUSUM alone)",
    )
    args = ap.parse_args()
    config = DivergenceConfig(
        evidence_per_doubling=args.evidence_per_doubling, window_steps=args.window_steps
    )
    world = args.ranks
    if world < 2 * FAULTY:
        ap.error(f"--ranks must be >= {2 * FAULTY}")
    n_faulty = FAULTY * args.trials
    print(
        f"detection quality: {world:,} ranks, loss noise {5}% per rank (= 1 sigma), onset at "
        f"step {ONSET}, {FAULTY} faulty ranks x {args.trials} trials = {n_faulty} per row; "
        f"CUSUM limit {config.limit_for(world):.2f} (evidence_per_doubling "
        f"{config.evidence_per_doubling:g}), window test "
        + (f"over {config.window_steps} steps" if config.window_steps else "off")
    )
    head = f"{'within 5':>7} {'median':>6} {'p95':>6} {'in ' + str(WINDOW):>6}"
    print(f"{'fault':<22}| rankwatch: {head} | baseline 3x|z|>=3: {head}")
    collateral = base_collateral = 0
    ratios: list[str] = []
    against: list[str] = []
    sigmas = [float(x) for x in args.sigmas.split(",") if x]
    rows = [("drift", s, f"drift {s:g} sigma") for s in sigmas]
    rows += [("nan", None, "NaN"), ("spike", 20.0, "spike 20 sigma, 1 step")]
    for kind, sigma, label in rows:
        ours: list[int | None] = []
        base: list[int | None] = []
        for trial in range(args.first_trial, args.first_trial + args.trials):
            res = fault_trial(world, kind, sigma, 1000 * trial + int(sigma or 0), config)
            ours += res["ours"]  # type: ignore[operator]
            base += res["base"]  # type: ignore[operator]
            collateral += res["collateral"]  # type: ignore[operator]
            base_collateral += res["base_collateral"]  # type: ignore[operator]
        print(f"{label:<22}| {' ' * 11}{describe(ours)} | {' ' * 19}{describe(base)}")
        if kind == "drift":
            a, b = within(ours), within(base)
            ratios.append(f"{sigma:g} sigma " + (f"{a / b:.1f}x" if b else f"{a:.0%} vs 0%"))
            top = ceiling(alpha(world), float(sigma or 0))
            lo, hi = wilson(round(a * len(ours)), len(ours))
            against.append(
                f"{sigma:g} sigma: {a:.3f} [{lo:.3f}, {hi:.3f}] of ceiling {top:.3f} = "
                f"{a / top:.3f} [{lo / top:.3f}, {min(hi / top, 1.0):.3f}]; delays 1..{HISTOGRAM}: "
                + histogram(ours)
            )
    print("(spike row: a one-step spike should not be flagged: 'in 30' is the false-flag share)")
    print(f"recall within {WITHIN} steps, rankwatch / baseline: {', '.join(ratios)}")
    print(
        f"recall within {WITHIN} steps [95 % interval] against the ceiling at the budget "
        f"(alpha {alpha(world):.2e} per rank, step and metric), and the delay distribution:"
    )
    for line in against:
        print("  " + line)
    print(
        f"flags on non-faulty ranks during those trials: rankwatch {collateral}, baseline "
        f"{base_collateral} (over {len(rows) * args.trials * world * (ONSET + WINDOW - 1):,} "
        "rank-steps of loss)"
    )
    if not args.seeds:
        return
    t0 = time.perf_counter()
    ours_ff, base_ff, by_metric, per_update = false_flags(
        world, args.clean_steps, args.seeds, config
    )
    rank_steps = world * args.clean_steps * args.seeds
    per_m = 1e6 / rank_steps
    detail = ", ".join(f"{m} {c}" for m, c in by_metric.items())
    print(
        f"false flags, clean runs ({args.seeds} x {args.clean_steps:,} steps x {world:,} ranks "
        f"= {rank_steps:,} rank-steps, 5 metrics each): rankwatch {ours_ff} "
        f"({ours_ff * per_m:.2f} per million rank-steps; {detail}) | baseline {base_ff} "
        f"({base_ff * per_m:.2f} per million)"
    )
    print(
        f"update() cost in the clean runs: {per_update * 1e6:.0f} us per (metric, step) at "
        f"{world:,} ranks; {time.perf_counter() - t0:.1f} s for the clean runs"
    )


if __name__ == "__main__":
    main()
