"""The false-alarm budget per run-hour, the detection ceiling under it, and where the divergence
detector stands: the figures behind issue-level targets, restated where a person feels them.

    python bench/alarm_budget.py [--hours 8:40,64:8,1024:1,4096:0.5] [--trials 200000]

Budget: at most ``BUDGET_PER_HOUR`` (0.1) false alarms per run-hour at 1 step/s with the five
default metrics scored (loss, lr, throughput, step_time, grad_norm), at every world size. Per
rank, step and metric that is ``alpha(n) = 0.1 / (3600 * n * 5)``: 7e-7 at 8 ranks, 1.4e-9 at
4,096; a per-rank-step budget (the old "< 1 per 10^6 rank-steps") is 74 alarms an hour there.

Printed, per world size, on the normal model (clean z ~ N(0, 1), a 3 sigma shift from a known
onset, "within 5 steps"):

* the ceiling: a test that knows the onset and sums its 5 z-scores, two-sided at ``alpha(n)``
  (no detector that does not know the onset can beat it);
* the CUSUM as configured (allowance 1.5, a step adding at most limit / 2): at today's limit
  (``DivergenceConfig.limit_for``) and at the limit that spends exactly ``alpha(n)`` (found on
  ``false_alarms.flag_rate``'s Markov chain); recall by Monte Carlo from a warmed-up evidence;
* a window-sum test (the sum of the last 5 z-scores, each clipped at half the threshold so one
  spike cannot flag alone) at ``alpha(n)``;

then the real ``DivergenceDetector`` on the load generator's clean model (``bench/loadgen.py``),
all five metrics, for the given run-hours per world size: its false alarms per run-hour, by
metric, with a Poisson 95 % upper bound, next to the budget.
"""

from __future__ import annotations

import argparse
import math
import time
from statistics import NormalDist

import numpy as np
from detection_quality import false_flags
from false_alarms import flag_rate
from loadgen import METRICS
from rankwatch.aggregator.divergence.config import DivergenceConfig

BUDGET_PER_HOUR = 0.1
STEPS_PER_HOUR = 3600  # 1 step/s
SHIFT = 3.0
WINDOW = 5
WORLDS = (8, 64, 1_024, 4_096)
_N01 = NormalDist()


def alpha(n: int) -> float:
    return BUDGET_PER_HOUR / (STEPS_PER_HOUR * n * len(METRICS))


def window_threshold(a: float) -> float:
    return _N01.inv_cdf(1 - a / 2) * math.sqrt(WINDOW)


def ceiling(a: float) -> float:
    t = window_threshold(a)
    return 1 - _N01.cdf((t - SHIFT * WINDOW) / math.sqrt(WINDOW))


def limit_for_alpha(a: float, allowance: float, confirm: int) -> float:
    lo, hi = 1.0, 30.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if flag_rate(mid, allowance, confirm) > a else (lo, mid)
    return hi


def cusum_recall(limit: float, cfg: DivergenceConfig, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    cap, k = limit / cfg.confirm_steps, cfg.z_allowance
    ev = np.zeros(trials)
    for _ in range(30):  # clean steps first, as the detector has seen before a fault
        ev = np.clip(ev + np.minimum(rng.standard_normal(trials) - k, cap), 0.0, limit)
        ev[ev >= limit] = 0.0
    hit = np.zeros(trials, bool)
    for _ in range(WINDOW):
        ev = np.clip(ev + np.minimum(rng.standard_normal(trials) + SHIFT - k, cap), 0.0, limit)
        hit |= ev >= limit
    return float(hit.mean())


def window_recall(a: float, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    t = window_threshold(a)
    z = rng.standard_normal((trials, 2 * WINDOW - 1))
    z[:, WINDOW - 1 :] += SHIFT
    z = np.minimum(z, t / 2)
    hit = np.zeros(trials, bool)
    for end in range(WINDOW, 2 * WINDOW):
        hit |= z[:, end - WINDOW : end].sum(axis=1) >= t
    return float(hit.mean())


def poisson_upper(count: int) -> float:
    """95 % one-sided upper bound of a Poisson mean after ``count`` events."""
    lo, hi = float(count), count + 10.0 * math.sqrt(count + 1) + 10
    for _ in range(60):
        mid = (lo + hi) / 2
        p = sum(math.exp(-mid) * mid**i / math.factorial(i) for i in range(count + 1))
        lo, hi = (mid, hi) if p > 0.05 else (lo, mid)
    return hi


def parse_hours(text: str) -> dict[int, float]:
    out = {}
    for item in text.split(","):
        world, hours = item.split(":")
        out[int(world)] = float(hours)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", default="8:40,64:8,1024:1,4096:0.5", help="WORLD:RUN_HOURS,...")
    ap.add_argument("--trials", type=int, default=200_000, help="Monte Carlo trials per row")
    args = ap.parse_args()
    cfg = DivergenceConfig()
    k, confirm = cfg.z_allowance, cfg.confirm_steps
    print(
        f"budget {BUDGET_PER_HOUR} false alarms per run-hour, 1 step/s, {len(METRICS)} metrics; "
        f"{SHIFT:g} sigma shift flagged within {WINDOW} steps (normal model)"
    )
    print(
        f"{'ranks':>6} {'alpha':>9} {'ceiling':>8} | {'limit':>5} {'alarms/h':>8} {'recall':>7} "
        f"{'of ceil':>7} | {'limit*':>6} {'recall':>7} {'of ceil':>7} | "
        f"{'window':>7} {'of ceil':>7}"
    )
    for n in WORLDS:
        a = alpha(n)
        top = ceiling(a)
        now = cfg.limit_for(n)
        per_hour = flag_rate(now, k, confirm) * STEPS_PER_HOUR * n * len(METRICS)
        r_now = cusum_recall(now, cfg, args.trials, n)
        spent = limit_for_alpha(a, k, confirm)
        r_spent = cusum_recall(spent, cfg, args.trials, n + 1)
        r_win = window_recall(a, args.trials, n + 2)
        print(
            f"{n:6,} {a:9.2e} {top:8.3f} | {now:5.2f} {per_hour:8.3f} {r_now:7.3f} "
            f"{r_now / top:7.2f} | {spent:6.2f} {r_spent:7.3f} {r_spent / top:7.2f} | "
            f"{r_win:7.3f} {r_win / top:7.2f}"
        )
    print("limit: today's; limit*: the one that spends the budget; window: 5-step sum test")
    print("\nthe real detector on the load generator's clean model, all five metrics:")
    print(f"{'ranks':>6} {'run-h':>6} {'alarms':>6} {'per run-h':>9} {'95% upper':>9} by metric")
    for n, hours in parse_hours(args.hours).items():
        steps = max(1, round(hours * STEPS_PER_HOUR))
        t0 = time.perf_counter()
        ours, _, by_metric, _ = false_flags(n, steps, 1, cfg)
        spent_s = time.perf_counter() - t0
        run_h = steps / STEPS_PER_HOUR
        detail = ", ".join(f"{m} {c}" for m, c in by_metric.items() if c) or "none"
        print(
            f"{n:6,} {run_h:6.2f} {ours:6d} {ours / run_h:9.3f} {poisson_upper(ours) / run_h:9.3f} "
            f"{detail} ({spent_s:.0f} s)"
        )


if __name__ == "__main__":
    main()
