"""The false-alarm budget per run-hour, the detection ceiling under it, and where the divergence
detector stands: the figures behind issue-level targets, restated where a person feels them.

    python bench/alarm_budget.py [--hours 8:40,64:8,1024:1,4096:0.5] [--trials 200000]
                                 [--worlds 8,64,1024,4096] [--window-allowance A]

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
* the detector's window-sum test as configured (``aggregator/divergence/window.py``: the last
  5 steps of ``min(max(z - 0.5, 0), 0.4 h)``, its limit ``h`` spending ``window_alarms_per_hour``
  of the budget), alone and together with today's CUSUM (what the detector flags: either), for
  a 3 and a 4 sigma shift, with the delay distribution of the 3 sigma one;

then the real ``DivergenceDetector`` on the load generator's clean model (``bench/loadgen.py``),
all five metrics, for the given run-hours per world size: its false alarms per run-hour, by
metric, with a Poisson 95 % upper bound, next to the budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import numpy as np
from detection_quality import BUDGET_PER_HOUR, STEPS_PER_HOUR, alpha, ceiling, false_flags
from false_alarms import flag_rate
from loadgen import METRICS
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.window import window_limit

SHIFT = 3.0
WINDOW = 5
WORLDS = (8, 64, 1_024, 4_096)
WARMUP = 30  # clean steps before the shift, as the detector has seen before a fault


def limit_for_alpha(a: float, allowance: float, confirm: int) -> float:
    lo, hi = 1.0, 30.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if flag_rate(mid, allowance, confirm) > a else (lo, mid)
    return hi


def cusum_recall(limit: float, cfg: DivergenceConfig, trials: int, seed: int) -> float:
    return float((simulate(cfg, limit, None, SHIFT, trials, seed)[0] <= WINDOW).mean())


def simulate(
    cfg: DivergenceConfig,
    limit: float,
    window: tuple[float, float] | None,
    shift: float,
    trials: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Delays (1 = on the first shifted step; WINDOW + 1: not within WINDOW) of the CUSUM
    alone and of the CUSUM or the window test (``window``: its (h, cap)), one rank, z ~ N(0, 1)
    for WARMUP steps and then N(shift, 1). A flag before the shift restarts that test, as a
    resolved false flag would."""
    rng = np.random.default_rng(seed)
    cap, k = limit / cfg.confirm_steps, cfg.z_allowance
    keep = cfg.window_steps
    ev = np.zeros(trials)
    win = np.zeros((trials, max(keep, 1)))
    late = WINDOW + 1
    cusum = np.full(trials, late)
    either = np.full(trials, late)
    for t in range(WARMUP + WINDOW):
        z = rng.standard_normal(trials) + (shift if t >= WARMUP else 0.0)
        ev = np.clip(ev + np.minimum(z - k, cap), 0.0, limit)
        hit = ev >= limit
        if window is not None:
            h, wcap = window
            u = np.minimum(np.maximum(z - cfg.window_allowance, 0.0), wcap)
            win = np.roll(win, 1, axis=1)
            win[:, 0] = u
            w_hit = (u > 0) & (win.sum(axis=1) >= h)
        else:
            w_hit = np.zeros(trials, bool)
        if t < WARMUP:
            ev[hit] = 0.0
            win[w_hit] = 0.0
            continue
        d = t - WARMUP + 1
        cusum = np.where(hit & (cusum == late), d, cusum)
        either = np.where((hit | w_hit) & (either == late), d, either)
    return cusum, either


def delays(d: np.ndarray) -> str:
    counts = np.bincount(d, minlength=WINDOW + 2)[1:]
    return " ".join(f"{c / len(d):.3f}" for c in counts)


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
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="model rows")
    ap.add_argument(
        "--window-allowance",
        type=float,
        default=DivergenceConfig.window_allowance,
        help="the window test's allowance (the detector's setting of that name)",
    )
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    cfg = DivergenceConfig(window_allowance=args.window_allowance)
    k, confirm = cfg.z_allowance, cfg.confirm_steps
    print(
        f"budget {BUDGET_PER_HOUR} false alarms per run-hour, 1 step/s, {len(METRICS)} metrics; "
        f"{SHIFT:g} sigma shift flagged within {WINDOW} steps (normal model, "
        f"{args.trials:,} trials per cell: a recall's 95 % interval is about "
        f"+-{1.96 * math.sqrt(0.25 / args.trials):.3f})"
    )
    print(
        f"{'ranks':>6} {'alpha':>9} {'ceil 3s':>7} {'ceil 4s':>7} | {'limit':>5} {'alarms/h':>8} "
        f"{'recall':>6} {'of ceil':>7} | {'limit*':>6} {'recall':>6} {'of ceil':>7} | "
        f"{'h':>6} {'window':>6} {'either':>6} {'of ceil':>7} {'4s':>6}"
    )
    dist = []
    for n in worlds:
        a = alpha(n)
        top, top4 = ceiling(a, SHIFT, WINDOW), ceiling(a, 4.0, WINDOW)
        now = cfg.limit_for(n)
        per_hour = flag_rate(now, k, confirm) * STEPS_PER_HOUR * n * len(METRICS)
        spent = limit_for_alpha(a, k, confirm)
        r_spent = cusum_recall(spent, cfg, args.trials, n + 1)
        h = window_limit(cfg, n)
        cusum, either = simulate(cfg, now, h, SHIFT, args.trials, n)
        _, either4 = simulate(cfg, now, h, 4.0, args.trials, n + 2)
        win_alone = simulate(
            dataclasses.replace(cfg, z_allowance=1e9), now, h, SHIFT, args.trials, n
        )
        r_now = float((cusum <= WINDOW).mean())
        r_win = float((win_alone[1] <= WINDOW).mean())
        r_either = float((either <= WINDOW).mean())
        r4 = float((either4 <= WINDOW).mean())
        dist.append((n, delays(cusum), delays(either)))
        print(
            f"{n:6,} {a:9.2e} {top:7.3f} {top4:7.3f} | {now:5.2f} {per_hour:8.3f} {r_now:6.3f} "
            f"{r_now / top:7.3f} | {spent:6.2f} {r_spent:6.3f} {r_spent / top:7.3f} | "
            f"{h[0]:6.2f} {r_win:6.3f} {r_either:6.3f} {r_either / top:7.3f} {r4:6.4f}"
        )
    print(
        "ceil: the test that knows the onset and sums 5 z-scores, at alpha; limit: the CUSUM's "
        "today, limit*: the one that spends alpha alone;\nh: the window test's limit "
        f"({cfg.window_alarms_per_hour:g} of the {BUDGET_PER_HOUR:g}/h); window: it alone; "
        "either: what the detector flags (CUSUM or window); 4s: either, 4 sigma"
    )
    print(f"{SHIFT:g} sigma delay distribution (share flagged at delay 1..{WINDOW}, then later):")
    for n, c, e in dist:
        print(f"{n:6,} CUSUM alone: {c} | CUSUM or window: {e}")
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
