"""Silent data corruption: the ceiling of any test on a rank's local gradient norm, and the
false alarms the persistent-offset test spends on clean data.

    python bench/sdc_ceiling.py RUNS_DIR [RUNS_DIR ...] [--fault-step 20] [--within 20]
                                [--hours 20000] [--boot-hours 20000] [--check-steps 50000]
                                [--alternatives 16:5,20:4.9,...] [--alt-hours 2000]
                                [--replay 16:5,20:4.9]

``RUNS_DIR`` is what ``bench/sdc_msrun.py --keep DIR`` left (one clean run and the EPS runs of
one seed, as JSONL). Per EPS run, the evidence that the faulty rank's ``grad_norm_local`` holds
within ``--within`` steps of the onset, in standard deviations (its log ratio to the median of
the other ranks; the per-step sd from the clean run of the same seed):

* ``expected``: log(1 + EPS) over the sd of a ``--within``-step mean;
* ``onset known``: the mean of its ``--within`` bad log ratios, what a test that knows the
  onset and averages every bad step sees (the ceiling: no test that does not know the onset
  can do better at the same false-alarm rate);
* ``best sub-window``: the largest of every sub-window of those steps, an oracle above any
  sequential test (a CUSUM's evidence is one of these sums, and it needs a higher limit);
* ``loss pooled``: the onset-known mean after the rank's own local loss log ratio is regressed
  out (slope from the clean run: a harder batch has a higher loss and a larger gradient; the
  corruption scales the gradient after the loss, so it stays whole in what is left).

Against the limit the budget allows an onset-known test: a two-sided false-alarm probability of
``budget / (3600 * ranks)`` per rank-step at 1 step/s, the whole budget (0.1 per run-hour)
spent on this one test.

Then the offset test as configured (``aggregator/divergence/offset.py``: a rank's mean log ratio
over ``offset_steps`` steps against the pooled, averaged spread) on clean data: its false
alarms per run-hour at its limit and at lower ones, on i.i.d. normal log values and on the clean
runs' steps drawn with replacement, ranks shuffled within each step (runs of one hour, each a
fresh detector with its warm-up). Counted with a vectorised copy of the test, checked against
the real ``DivergenceDetector`` on ``--check-steps`` bootstrap steps at the low limits (the copy
leaves out the CUSUM's outlier flags and the removal of flagged ranks from the others'
references: a few flags either way). ``--alternatives``: other windows and limits of the same
test on the normal model, their false alarms per run-hour and how often they flag EPS 0.2 to 0.3
within ``--within`` steps of an onset long after the warm-up; ``--replay``: the kept runs through
the real detector with those windows and limits.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from rankwatch.aggregator.divergence import offset
from rankwatch.aggregator.divergence.config import DEFAULT_RULES, DivergenceConfig, MetricRule
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.merge import StepValues
from sdc_msrun import FAULT_RANK, METRIC, read_metrics, replay, verdict

BUDGET_PER_HOUR = 0.1
STEPS_PER_HOUR = 3600  # 1 step/s
LIMITS = (3.5, 4.0, 4.5, 5.0)  # the offset test's z limits counted; 5.0 is OFFSET_Z
CHUNK_HOURS = 50
# sd of a rank's log value on the normal model; its log ratio to the others' median is ~1.2x
# wider. The z is free of the scale (but for ``rel_floor``, far below it).
NORMAL_LOG_SD = 0.14

Draw = Callable[[np.random.Generator, int, int, int], np.ndarray]  # (rng, runs, steps, ranks)


def step_matrix(series: dict[int, dict[int, float]], ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values[step, rank]) of the steps every rank reported."""
    steps = np.array(sorted(t for t, row in series.items() if len(row) == ranks))
    return steps, np.array([[series[t][r] for r in range(ranks)] for t in steps.tolist()])


def others_medians(x: np.ndarray) -> np.ndarray:
    """``offset.others_medians`` along the last axis."""
    n = x.shape[-1]
    order = np.argsort(x, axis=-1, kind="stable")
    a = np.take_along_axis(x, order, -1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(n), x.shape), -1)
    m = n - 1

    def pick(k: int) -> np.ndarray:
        return np.where(pos > k, a[..., k : k + 1], a[..., k + 1 : k + 2])

    if m % 2:
        return pick(m // 2)
    return (pick(m // 2 - 1) + pick(m // 2)) / 2


def log_ratios(values: np.ndarray) -> np.ndarray:
    return np.log(values / others_medians(values))


def normal_z(alpha_two_sided: float) -> float:
    return statistics.NormalDist().inv_cdf(1.0 - alpha_two_sided / 2.0)


def offset_z(logs: np.ndarray, w: int, rel_floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The offset test's (z, window mean) for logs[run, step, rank], NaN before it tests: the
    window mean over the pooled spread around each rank's window mean, averaged (EWMA 1/w)."""
    runs, _, n = logs.shape
    c = np.concatenate([np.zeros((runs, 1, n)), np.cumsum(logs, axis=1)], axis=1)
    c2 = np.concatenate([np.zeros((runs, 1, n)), np.cumsum(logs**2, axis=1)], axis=1)
    s, s2 = c[:, w:] - c[:, :-w], c2[:, w:] - c2[:, :-w]  # windows ending at step w-1 ...
    means = s / w
    spread = (s2 - w * means**2).sum(axis=2) / (n * (w - 1))
    var = np.maximum(spread, rel_floor**2)
    ewma = np.empty_like(var)
    ewma[:, 0] = var[:, 0]
    for t in range(1, var.shape[1]):
        ewma[:, t] = ewma[:, t - 1] + (var[:, t] - ewma[:, t - 1]) / w
    z = means / np.sqrt(ewma / w)[:, :, None]
    z[:, : w - 1] = np.nan  # ``seen < w``
    pad = np.full((runs, w - 1, n), np.nan)
    return np.concatenate([pad, z], axis=1), np.concatenate([pad, means], axis=1)


def count_alarms(z: np.ndarray, means: np.ndarray, limit: float, cfg: DivergenceConfig) -> int:
    """New flags: |z| past ``limit`` and the ratio gate, while not flagged; a flag resolves
    after ``clear_steps`` consecutive steps below half the limit."""
    gate = (np.exp(means) >= cfg.high_ratio) | (np.exp(means) <= cfg.low_ratio)
    over = (np.abs(z) >= limit) & gate
    alarms = 0
    for run, rank in zip(*np.nonzero(over.any(axis=1)), strict=True):
        az, hits = np.abs(z[run, :, rank]), np.flatnonzero(over[run, :, rank])
        free_from = 0
        for t in hits.tolist():
            if t < free_from:
                continue
            alarms += 1
            clean, u = 0, t + 1
            while u < len(az) and clean < cfg.clear_steps:
                clean = clean + 1 if az[u] < limit / 2 else 0
                u += 1
            free_from = u if clean >= cfg.clear_steps else len(az)
    return alarms


def rates(
    draw: Draw, hours: int, n: int, w: int, cfg: DivergenceConfig, rng: np.random.Generator
) -> dict[float, int]:
    out = dict.fromkeys(LIMITS, 0)
    done = 0
    while done < hours:
        k = min(CHUNK_HOURS, hours - done)
        logs = log_ratios(draw(rng, k, STEPS_PER_HOUR, n))
        z, means = offset_z(logs, w, cfg.rel_floor)
        for limit in LIMITS:
            out[limit] += count_alarms(z, means, limit, cfg)
        done += k
    return out


def normal_draw(rng: np.random.Generator, runs: int, steps: int, n: int) -> np.ndarray:
    return np.exp(NORMAL_LOG_SD * rng.standard_normal((runs, steps, n)))


def bootstrap_draw(rows: np.ndarray) -> Draw:
    """Steps of ``rows`` drawn with replacement, the ranks shuffled within each step."""

    def draw(rng: np.random.Generator, runs: int, steps: int, n: int) -> np.ndarray:
        picked = rows[rng.integers(0, len(rows), (runs, steps))]
        shuffle = np.argsort(rng.random(picked.shape), axis=-1)
        return np.take_along_axis(picked, shuffle, -1)

    return draw


def detector_check(
    rows: np.ndarray, steps: int, w: int, cfg: DivergenceConfig, rng: np.random.Generator
) -> dict[float, tuple[int, int]]:
    """(real detector's offset flags, the copy's) on one bootstrap run at each low limit."""
    values = bootstrap_draw(rows)(rng, 1, steps, rows.shape[1])
    z, means = offset_z(log_ratios(values), w, cfg.rel_floor)
    out = {}
    saved = offset.OFFSET_Z
    try:
        for limit in LIMITS[:2]:
            offset.OFFSET_Z = limit  # the module's limit, read on every step
            det, flags = DivergenceDetector(cfg), 0
            for t in range(steps):
                row = {r: float(v) for r, v in enumerate(values[0, t].tolist())}
                res = det.update(StepValues("boot", METRIC, t, row, len(row), True))
                flags += sum(d.kind == offset.KIND for d in res.new)
            out[limit] = (flags, count_alarms(z, means, limit, cfg))
    finally:
        offset.OFFSET_Z = saved
    return out


def recall(
    w: int,
    limit: float,
    eps: float,
    args: argparse.Namespace,
    cfg: DivergenceConfig,
    rng: np.random.Generator,
    runs: int = 20_000,
) -> float:
    """Share of runs on the normal model whose rank ``FAULT_RANK``, scaled by 1 + ``eps`` from a
    step long after the warm-up, is flagged by a ``w``-step offset test at ``limit`` within
    ``args.within`` steps."""
    onset = 5 * w
    values = normal_draw(rng, runs, onset + args.within, 4)
    values[:, onset:, FAULT_RANK] *= 1 + eps
    z, means = offset_z(log_ratios(values), w, cfg.rel_floor)
    zz, mm = z[:, onset:, FAULT_RANK], means[:, onset:, FAULT_RANK]
    return float(((np.abs(zz) >= limit) & (np.exp(mm) >= cfg.high_ratio)).any(axis=1).mean())


def alternatives(args: argparse.Namespace, cfg: DivergenceConfig, rng: np.random.Generator) -> None:
    """Other windows and limits of the same test on the normal model, 4 ranks: false alarms
    per run-hour and recall within ``args.within`` steps."""
    print(f"\nwindows and limits on the normal model, 4 ranks ({args.alt_hours} run-hours each):")
    for spec in args.alternatives.split(","):
        w_s, lim_s = spec.split(":")
        w, limit = int(w_s), float(lim_s)
        alarms = 0
        for _ in range(0, args.alt_hours, CHUNK_HOURS):
            logs = log_ratios(normal_draw(rng, CHUNK_HOURS, STEPS_PER_HOUR, 4))
            alarms += count_alarms(*offset_z(logs, w, cfg.rel_floor), limit, cfg)
        hours = -(-args.alt_hours // CHUNK_HOURS) * CHUNK_HOURS
        said = ", ".join(
            f"EPS {e:g} {recall(w, limit, e, args, cfg, rng):.3f}" for e in (0.2, 0.25, 0.3)
        )
        print(
            f"  {w} steps, limit {limit:g}: {alarms} false alarms ({alarms / hours:.2g}/h); "
            f"flagged within {args.within} steps: {said}"
        )


def replay_window(folders: list[Path], spec: str, args: argparse.Namespace) -> None:
    """Each kept run's records through the real detector with the offset test's window and limit
    set to ``spec`` (window:limit): the verdicts serve would have given."""
    w_s, lim_s = spec.split(":")
    rules = dict(DEFAULT_RULES)
    rules[METRIC] = replace(rules.get(METRIC, MetricRule()), offset_steps=int(w_s))
    cfg = DivergenceConfig(rules=rules)
    saved = offset.OFFSET_Z
    offset.OFFSET_Z = float(lim_s)
    try:
        for folder in folders:
            said = []
            for run in sorted(p for p in (folder / "jsonl").iterdir() if p.is_dir()):
                faulty = "-eps" in run.name
                v = verdict(replay(run.name, read_metrics(run), cfg), args, faulty)
                hit = v["hit"]
                label = run.name.rsplit("-", 1)[1]
                got = f"{hit['kind']} after {hit['step'] - args.fault_step + 1}" if hit else "-"
                said.append(
                    f"{label} {got}" + (f" ({len(v['false'])} false)" if v["false"] else "")
                )
            print(f"  {spec} {folder}: {'; '.join(said)}")
    finally:
        offset.OFFSET_Z = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="sdc_msrun.py --keep directories")
    parser.add_argument("--fault-step", type=int, default=20)
    parser.add_argument("--within", type=int, default=20)
    parser.add_argument("--hours", type=int, default=20_000, help="normal-model run-hours")
    parser.add_argument("--boot-hours", type=int, default=20_000, help="bootstrap run-hours")
    parser.add_argument("--check-steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--alternatives", default="16:5,20:4.9,20:4.8,24:4.9", help="window:limit,... ('' off)"
    )
    parser.add_argument("--alt-hours", type=int, default=2_000)
    parser.add_argument(
        "--replay", default="16:5,20:4.9", help="window:limit,... through the real detector"
    )
    args = parser.parse_args()
    cfg = DivergenceConfig()
    w = cfg.rule(METRIC).offset_steps
    if w is None:
        raise SystemExit(f"the offset test is off for {METRIC}")
    rng = np.random.default_rng(args.seed)
    clean_rows = []
    for folder in args.runs:
        runs = sorted(p for p in (folder / "jsonl").iterdir() if p.is_dir())
        clean = next(p for p in runs if p.name.endswith("-clean"))
        _, cv = step_matrix(read_metrics(clean)[METRIC], 4)
        n = cv.shape[1]
        clean_rows.append(cv)
        cl = log_ratios(cv)
        sd = float(cl.std())
        _, closs = step_matrix(read_metrics(clean)["loss"], n)
        ll = log_ratios(closs)
        beta = float((cl * ll).sum() / (ll * ll).sum())
        sd_res = float((cl - beta * ll).std())
        need = normal_z(BUDGET_PER_HOUR / (STEPS_PER_HOUR * n))
        print(
            f"{folder}: {n} ranks, per-step sd of a rank's log ratio {sd:.3f} (clean run); "
            f"{args.within}-step mean {sd / math.sqrt(args.within):.4f}; loss pooled: slope "
            f"{beta:.2f}, sd {sd_res:.3f}; onset-known limit at {BUDGET_PER_HOUR} per run-hour "
            f"(the whole budget): {need:.2f} sd"
        )
        for run in runs:
            if "-eps" not in run.name:
                continue
            eps = float(run.name.rsplit("-eps", 1)[1])
            series = read_metrics(run)
            steps, v = step_matrix(series[METRIC], n)
            lsteps, lv = step_matrix(series["loss"], n)
            bad = (steps >= args.fault_step) & (steps < args.fault_step + args.within)
            x = log_ratios(v)[bad, FAULT_RANK]
            lbad = (lsteps >= args.fault_step) & (lsteps < args.fault_step + args.within)
            xr = x - beta * log_ratios(lv)[lbad, FAULT_RANK]
            k = len(x)
            best = max(
                x[a : b + 1].sum() / (sd * math.sqrt(b - a + 1))
                for a in range(k)
                for b in range(a, k)
            )
            print(
                f"  EPS {eps:g}: expected {math.log1p(eps) / sd * math.sqrt(k):.2f} sd, onset "
                f"known {x.mean() / sd * math.sqrt(k):.2f}, best sub-window {best:.2f}, loss "
                f"pooled {xr.mean() / sd_res * math.sqrt(k):.2f} (limit {need:.2f})"
            )
    rows = np.vstack(clean_rows)
    n = rows.shape[1]
    print(
        f"\nthe offset test ({w} steps, limit {offset.OFFSET_Z:g} up to "
        f"{cfg.evidence_ranks} ranks) on clean data, false alarms per run-hour at 1 step/s:"
    )
    for label, draw, hours, worlds in (
        ("normal", normal_draw, args.hours, (n, 8)),
        (f"bootstrap of {len(rows)} clean steps", bootstrap_draw(rows), args.boot_hours, (n,)),
    ):
        for ranks in worlds:
            got = rates(draw, hours, ranks, w, cfg, rng)
            said = ", ".join(f"limit {lim:g}: {c} ({c / hours:.2g}/h)" for lim, c in got.items())
            print(f"  {label}, {ranks} ranks, {hours} run-hours: {said}")
    if args.check_steps:
        check = detector_check(rows, args.check_steps, w, cfg, rng)
        said = ", ".join(f"limit {lim:g}: {a} vs {b}" for lim, (a, b) in check.items())
        print(f"  check, real detector vs the copy, {args.check_steps} bootstrap steps: {said}")
    if args.alternatives:
        alternatives(args, cfg, rng)
    if args.replay:
        print("\nthe kept runs replayed through the real detector (delay 1 = the first bad step):")
        for spec in args.replay.split(","):
            replay_window(args.runs, spec, args)


if __name__ == "__main__":
    main()
