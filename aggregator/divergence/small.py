"""Small worlds: one step of a world whose ranks are all below ``PY_MAX_RANKS``, on lists.

numpy's fixed cost per call, some 50 calls a step, would dominate a small world, where the
arithmetic itself takes a few microseconds (docs/benchmarks.md). The lists follow numpy's
percentile and summation exactly (``lists``), and flagging, blaming and resolving are
``state``'s, so a verdict never depends on the path: ``large.score_arrays`` computes the same
floats in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rankwatch.aggregator.divergence import onset, window
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.lists import PAIRWISE_BLOCK, step_stats
from rankwatch.aggregator.divergence.lists import no_outliers as _no_outliers
from rankwatch.aggregator.divergence.lists import rel_list as _rel_lists
from rankwatch.aggregator.divergence.state import (
    MetricState,
    check_active,
    clear_nonfinite,
    flag_nonfinite,
    gates,
    learn_spread,
    new_outliers,
    scale,
)
from rankwatch.aggregator.divergence.types import (
    Divergence,
    RankScores,
    StepResult,
    StepStats,
    new_result,
    new_stats,
)
from rankwatch.aggregator.merge import StepValues

# Worlds whose ranks are all below this are scored on lists, which beat numpy there
# (bench/divergence_cost.py). Lists follow numpy's summation only up to PAIRWISE_BLOCK values,
# hence the cap.
PY_MAX_RANKS = PAIRWISE_BLOCK

_NONE: frozenset[int] = frozenset()


def score_lists(cfg: DivergenceConfig, st: MetricState, sv: StepValues, top: int) -> StepResult:
    """One step of a world whose ranks are all below ``PY_MAX_RANKS``, on plain lists."""
    rule, step = st.rule, sv.step
    ranks = list(sv.values)
    values = list(sv.values.values())
    st.grow(top, PY_MAX_RANKS)
    total = sum(values)
    if total - total == 0:  # all finite (else NaN, or a sum that overflowed: look closer)
        fin_ranks, fin_values, bad = ranks, values, []
    else:
        fin_ranks = [r for r, x in zip(ranks, values, strict=True) if math.isfinite(x)]
        fin_values = [x for x in values if math.isfinite(x)]
        bad = [(r, x) for r, x in zip(ranks, values, strict=True) if not math.isfinite(x)]
    n = len(fin_values)
    stats = new_stats(sv.run, sv.metric, step, n, *step_stats(fin_values)) if n else no_stats(sv)
    in_order = st.last_step is None or step > st.last_step
    if in_order:
        st.last_step = step
    new: list[Divergence] = []
    resolved: list[Divergence] = []
    if bad:
        flag_nonfinite(st, sv, stats, bad, new)
    if in_order and st.active and any(k[1] == "nonfinite" for k in st.active):
        clear_nonfinite(cfg, st, step, set(fin_ranks), resolved)

    if n:
        med, sc = stats.median, scale(cfg, st, stats)
        if (
            in_order
            and not bad
            and st.calm
            and not st.active
            and not resolved
            and sc > 0
            and (stats.max - med) / sc < cfg.quiet_below  # max(z), exactly: z rises with x
            and (med - stats.min) / sc < cfg.quiet_below
            and cfg.quiet_below <= cfg.z_threshold
        ):
            # The usual step: nobody is out, no evidence to keep. The scores are only read
            # by the dashboard, so they are computed if and when it asks.
            if n >= 2:
                learn_spread(cfg, st, stats, fin_ranks, fin_values)

            def fill() -> tuple[list[float], list[float]]:
                return [(x - med) / sc for x in values], _rel_lists(values, med)

            scores = RankScores.lazy(ranks, values, _no_outliers(n), fill)
            return new_result(stats, scores, [], [])
        z = [(x - med) / sc for x in fin_values]
        rel = _rel_lists(fin_values, med)
    else:
        z = rel = []
    outlier: Sequence[bool] = _no_outliers(n)
    hi_ok = rule.direction in ("both", "high")
    lo_ok = rule.direction in ("both", "low")
    if n and (hi_ok or lo_ok):
        zt, z_hi, z_lo = cfg.z_threshold, max(z), min(z)
        if z_hi >= zt or z_lo <= -zt:
            hi_ratio, lo_ratio = gates(rule, n)
            outlier = [
                (hi_ok and zi >= zt and ri >= hi_ratio) or (lo_ok and zi <= -zt and ri <= lo_ratio)
                for zi, ri in zip(z, rel, strict=True)
            ]
        if in_order and n >= 2:
            quiet = z_hi < cfg.quiet_below and -z_lo < cfg.quiet_below
            _evidence(cfg, st, sv, stats, fin_ranks, fin_values, z, rel, quiet, new, resolved)
    if n >= 2 and in_order:
        learn_spread(cfg, st, stats, fin_ranks, fin_values)
    if bad:  # the non-finite ranks back in, in the StepValues' order
        scored = iter(zip(z, rel, outlier, strict=True))
        nan_row = (math.nan, math.nan, False)
        rows = [next(scored) if math.isfinite(x) else nan_row for x in values]
        z = [row[0] for row in rows]
        rel = [row[1] for row in rows]
        outlier = [row[2] for row in rows]
    flagged = frozenset(r for (r, _) in st.active) if st.active else _NONE
    return StepResult(stats, RankScores(ranks, values, z, rel, outlier, flagged), new, resolved)


def _evidence(
    cfg: DivergenceConfig,
    st: MetricState,
    sv: StepValues,
    stats: StepStats,
    ranks: list[int],
    v: list[float],
    z: list[float],
    rel: list[float],
    quiet: bool,
    new: list[Divergence],
    resolved: list[Divergence],
) -> None:
    """``large._evidence`` one rank at a time (same operations, same order).

    ``quiet``: every |z| is below ``quiet_below``, so every rank's step evidence is negative
    and no window gets an addition.
    """
    rule, step, n = st.rule, sv.step, stats.n
    if n == 2 and st.spread_steps < cfg.pair_warmup_steps:
        return  # a pair has no yardstick yet
    if quiet and st.calm:  # zero evidence plus negative evidence stays zero: no writes
        if st.active:
            at = {r: i for i, r in enumerate(ranks)}
            check_active(cfg, st, step, at, z, rel, n, resolved)
        return
    limit, allowance = cfg.limit_for(n), cfg.z_allowance
    cap = limit / (cfg.confirm_steps if n >= cfg.small_n else cfg.small_confirm_steps)
    hi_ratio, lo_ratio = gates(rule, n)
    threshold = cfg.z_threshold
    sides = []
    hit = False  # a rank reached the limit (resolving below only lowers evidence)
    for direction in ("high", "low"):
        if rule.direction not in ("both", direction):
            continue
        if direction == "high":
            ev, start, signed = st.ev_hi, st.start_hi, z
            run, out = st.run_hi, st.out_hi
            gate = [ri >= hi_ratio for ri in rel]
        else:
            ev, start, signed = st.ev_lo, st.start_lo, [-zi for zi in z]
            run, out = st.run_lo, st.out_lo
            gate = [ri <= lo_ratio for ri in rel]
        for r, zi, ok in zip(ranks, signed, gate, strict=True):
            s = zi - allowance
            if s > cap:
                s = cap
            if not ok and not s < 0:
                s = 0.0
            before = ev[r]
            after = before + s
            if after < 0.0:
                after = 0.0
            elif after > limit:
                after = limit
            ev[r] = after
            if after > 0:
                began = before == 0
                if began:
                    start[r] = step
                onset.note(run, out, r, step, zi, began, threshold)
            if ok and after >= limit:
                hit = True
        sides.append((direction, ev, gate))
    windowed: set[tuple[int, str]] = set()
    if cfg.window_steps and n >= cfg.small_n:
        bounds = (hi_ratio, lo_ratio)
        for i, direction, since in window.step_lists(cfg, st, step, ranks, z, rel, n, bounds):
            windowed.add((i, direction))
            window.mark_start(st, direction, ranks[i], since)
            hit = True
    if st.active:
        check_active(cfg, st, step, {r: i for i, r in enumerate(ranks)}, z, rel, n, resolved)
    st.calm = not (any(st.ev_hi) or any(st.ev_lo) or st.win_live)
    if not hit:
        return
    active = st.active
    fresh = [
        (i, direction)
        for direction, ev, gate in sides
        for i, r in enumerate(ranks)
        if ((gate[i] and ev[r] >= limit) or (i, direction) in windowed)
        and (r, "outlier") not in active
    ]
    if fresh:
        new_outliers(cfg, st, sv, stats, fresh, ranks, v, z, rel, new)


def no_stats(sv: StepValues) -> StepStats:
    nan = math.nan
    return StepStats(sv.run, sv.metric, sv.step, 0, nan, nan, nan, nan, nan, nan, nan, nan, nan)
