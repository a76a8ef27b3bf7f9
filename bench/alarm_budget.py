"""The false-alarm budget per run-hour, the detection ceiling under it, and where the divergence
detector stands: the figures behind issue-level targets, restated where a person feels them.

    python bench/alarm_budget.py [--hours 8:30,64:30,1024:30,4096:8] [--trials 200000]
                                 [--worlds 8,64,1024,4096] [--window-allowance A]
                                 [--jobs 2] [--chunk-hours 1] [--first-run 0] [--no-model]
                                 [--drift-trials 0]

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
  ``budget.cusum_flag_rate``'s Markov chain); recall by Monte Carlo from a warmed-up evidence;
* the detector's window-sum test as configured (``aggregator/divergence/window.py``: the last
  5 steps of ``min(max(z - 0.5, 0), 0.4 h)``, its limit ``h`` spending what the CUSUM's
  limits leave of the budget, ``budget.window_alarms_per_hour``), alone and together with
  today's CUSUM (what the detector flags: either), for a 3 and a 4 sigma shift, with the
  delay distribution of the 3 sigma one;

then the real ``DivergenceDetector`` on the load generator's clean model (``bench/loadgen.py``),
all five metrics, for the given run-hours per world size: its false alarms per run-hour, by
metric, with a Poisson 95 % upper bound, next to the budget. The run-hours are cut into runs of
``--chunk-hours`` (each its own seed and a fresh detector, warm-up included, as a new job
starts) and spread over ``--jobs`` processes; each step of each metric is one
``update_array`` call (the path a grid's row takes), so what is timed is the detector.

With ``--drift-trials N``, also the real detector's recall per ``--worlds`` size: the load
generator's ``loss`` with one rank drifted by 3 and by 4 sigma after WARMUP clean steps, N
seeds, the share flagged within 5 steps and its delays (the model's recall assumes z ~ N(0, 1)
for the shifted rank; the real one moves the median and the MAD of a small world itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from detection_quality import BUDGET_PER_HOUR, STEPS_PER_HOUR, alpha, ceiling
from loadgen import METRICS, Fault, Model
from rankwatch.aggregator.divergence.budget import cusum_alarms_per_hour, window_alarms_per_hour
from rankwatch.aggregator.divergence.budget import cusum_flag_rate as flag_rate
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
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


RATE = 5.0  # the load generator's steps/s (only step_time and throughput depend on it)
SEED_BASE = 20_000  # clean runs' seeds: SEED_BASE + world size * 1,000 + run


def clean_run(world: int, steps: int, run: int, cfg: DivergenceConfig) -> tuple[dict, float]:
    """One clean run of the load generator's model through a fresh detector, all five
    metrics: (new divergences by metric, CPU seconds spent in the detector)."""
    model = Model(world, RATE, SEED_BASE + world * 1_000 + run, [])
    cfg.limit_for(world)  # derived once per world size (a server does so at its first step)
    det = DivergenceDetector(cfg)
    ranks = np.arange(world, dtype=np.int64)
    by_metric = dict.fromkeys(METRICS, 0)
    spent = 0.0
    for step in range(1, steps + 1):
        values = model.values(step)
        t0 = time.process_time()  # CPU time: the machine may be shared
        for metric in METRICS:
            new = det.update_array("clean", metric, step, ranks, values[metric], world).new
            if new:
                by_metric[metric] += len(new)
        spent += time.process_time() - t0
    return by_metric, spent


def dict_path_cost(world: int, steps: int, cfg: DivergenceConfig) -> float:
    """Baseline: CPU seconds per step of the same clean run fed as the bench did before, a
    ``StepValues`` (a dict of every rank's value) per metric through ``update``."""
    from rankwatch.aggregator.merge import StepValues

    model = Model(world, RATE, SEED_BASE + world * 1_000, [])
    cfg.limit_for(world)
    det = DivergenceDetector(cfg)
    spent = 0.0
    for step in range(1, steps + 1):
        values = model.values(step)
        t0 = time.process_time()
        for metric in METRICS:
            row = dict(zip(range(world), values[metric].tolist(), strict=True))
            det.update(StepValues("clean", metric, step, row, world, True))
        spent += time.process_time() - t0
    return spent / steps


DRIFT_RANK = 3  # the rank a drift trial shifts, from step WARMUP + 1 on


def drift_recall(world: int, shift: float, trials: int, cfg: DivergenceConfig) -> np.ndarray:
    """Delays (1 = on the first shifted step; WINDOW + 1: not within WINDOW) of the real
    detector on the load generator's ``loss`` (5 % per-rank noise) with one rank drifted by
    ``shift`` sigma after WARMUP clean steps, one trial per seed."""
    ranks = np.arange(world, dtype=np.int64)
    onset = WARMUP + 1
    out = np.full(trials, WINDOW + 1)
    for trial in range(trials):
        fault = Fault("drift", DRIFT_RANK, shift, onset)
        model = Model(world, RATE, SEED_BASE + 500 + trial, [fault])
        det = DivergenceDetector(cfg)
        for step in range(1, onset + WINDOW):
            values = model.values(step, 1)["loss"]
            new = det.update_array("drift", "loss", step, ranks, values, world).new
            if step >= onset and any(d.rank == DRIFT_RANK for d in new):
                out[trial] = step - onset + 1
                break
    return out


def _clean_job(args: tuple[int, int, int, DivergenceConfig]) -> tuple[dict, float]:
    return clean_run(*args)


def clean_alarms(
    world: int,
    hours: float,
    cfg: DivergenceConfig,
    chunk_hours: float,
    jobs: int,
    first_run: int = 0,
) -> tuple[int, float, dict[str, int], float]:
    """(alarms, run-hours, alarms by metric, detector CPU seconds per step) over ``hours``
    run-hours at 1 step/s, in runs of ``chunk_hours`` seeded from run ``first_run`` on (so
    two invocations add up to one longer run with no seed seen twice)."""
    total = max(1, round(hours * STEPS_PER_HOUR))
    per_run = max(1, round(chunk_hours * STEPS_PER_HOUR))
    runs = [(world, min(per_run, total - start), first_run + i, cfg)
            for i, start in enumerate(range(0, total, per_run))]  # fmt: skip
    by_metric = dict.fromkeys(METRICS, 0)
    spent = 0.0
    if jobs > 1 and len(runs) > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_clean_job, runs))
    else:
        results = [_clean_job(r) for r in runs]
    for found, seconds in results:
        spent += seconds
        for m, c in found.items():
            by_metric[m] += c
    return sum(by_metric.values()), total / STEPS_PER_HOUR, by_metric, spent / total


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
    ap.add_argument("--hours", default="8:30,64:30,1024:30,4096:8", help="WORLD:RUN_HOURS,...")
    ap.add_argument("--jobs", type=int, default=2, help="processes for the clean runs")
    ap.add_argument("--chunk-hours", type=float, default=1.0, help="run-hours per clean run")
    ap.add_argument(
        "--first-run", type=int, default=0, help="seed index of the first clean run (to extend)"
    )
    ap.add_argument("--no-model", action="store_true", help="only the real detector's runs")
    ap.add_argument(
        "--baseline-steps", type=int, default=300, help="steps of the dict-path baseline (0: off)"
    )
    ap.add_argument("--trials", type=int, default=200_000, help="Monte Carlo trials per row")
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="model rows")
    ap.add_argument(
        "--drift-trials",
        type=int,
        default=0,
        help="also the real detector's recall on a 3 and a 4 sigma drift, per --worlds (0: off)",
    )
    ap.add_argument(
        "--window-allowance",
        type=float,
        default=DivergenceConfig.window_allowance,
        help="the window test's allowance (the detector's setting of that name)",
    )
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    cfg = DivergenceConfig(window_allowance=args.window_allowance)
    if not args.no_model:
        model_rows(args, worlds, cfg)
    if args.drift_trials:
        print(
            f"\nthe real detector, one rank's loss drifted from step {WARMUP + 1}, "
            f"{args.drift_trials:,} seeds: flagged within {WINDOW} steps (delay 1..{WINDOW})"
        )
        for n in worlds:
            for shift in (SHIFT, 4.0):
                d = drift_recall(n, shift, args.drift_trials, cfg)
                print(
                    f"{n:6,} {shift:g} sigma (CUSUM limit {cfg.limit_for(n):.2f}): "
                    f"{float((d <= WINDOW).mean()):.3f} ({delays(d)})",
                    flush=True,
                )
    print("\nthe real detector on the load generator's clean model, all five metrics:")
    print(f"{'ranks':>6} {'run-h':>6} {'alarms':>6} {'per run-h':>9} {'95% upper':>9} by metric")
    for n, hours in parse_hours(args.hours).items():
        t0 = time.perf_counter()
        ours, run_h, by_metric, per_step = clean_alarms(
            n, hours, cfg, args.chunk_hours, args.jobs, args.first_run
        )
        wall = time.perf_counter() - t0
        detail = ", ".join(f"{m} {c}" for m, c in by_metric.items() if c) or "none"
        base = dict_path_cost(n, args.baseline_steps, cfg) if args.baseline_steps else math.nan
        print(
            f"{n:6,} {run_h:6.2f} {ours:6d} {ours / run_h:9.3f} {poisson_upper(ours) / run_h:9.3f} "
            f"{detail} ({wall:.0f} s wall, {args.jobs} jobs; detector {per_step * 1e3:.2f} ms CPU "
            f"per step of 5 metrics, dict path {base * 1e3:.2f} ms: {base / per_step:.2f}x)",
            flush=True,
        )


def model_rows(args: argparse.Namespace, worlds: list[int], cfg: DivergenceConfig) -> None:
    """The ceiling, the CUSUM and the window test on the normal model, per world size."""
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
        f"{'win/h':>6} {'h':>6} {'window':>6} {'either':>6} {'of ceil':>7} {'4s':>6}"
    )
    dist = []
    for n in worlds:
        a = alpha(n)
        top, top4 = ceiling(a, SHIFT, WINDOW), ceiling(a, 4.0, WINDOW)
        now = cfg.limit_for(n)
        per_hour = cusum_alarms_per_hour(cfg, n)  # what the budget counts it as spending
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
            f"{window_alarms_per_hour(cfg, n):6.3f} {h[0]:6.2f} {r_win:6.3f} {r_either:6.3f} "
            f"{r_either / top:7.3f} {r4:6.4f}"
        )
    print(
        "ceil: the test that knows the onset and sums 5 z-scores, at alpha; limit: the CUSUM's "
        "today, limit*: the one that spends alpha alone;\nwin/h: what the CUSUM leaves of the "
        f"{BUDGET_PER_HOUR:g}/h to the window test, h: its limit; window: it alone; "
        "either: what the detector flags (CUSUM or window); 4s: either, 4 sigma"
    )
    print(f"{SHIFT:g} sigma delay distribution (share flagged at delay 1..{WINDOW}, then later):")
    for n, c, e in dist:
        print(f"{n:6,} CUSUM alone: {c} | CUSUM or window: {e}")


if __name__ == "__main__":
    main()
