"""Large worlds: one step scored with numpy (4,096 ranks in well under a millisecond).

Same floats in the same order as ``small.score_lists``; flagging, blaming and resolving are
``state``'s.
"""

from __future__ import annotations

import numpy as np
from rankwatch.aggregator.divergence import onset, window
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.lists import plan_for, quantiles_at
from rankwatch.aggregator.divergence.lists import rel_list as _rel_lists
from rankwatch.aggregator.divergence.small import PY_MAX_RANKS, no_stats
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
from rankwatch.aggregator.divergence.types import Divergence, RankScores, StepResult, StepStats
from rankwatch.aggregator.merge import StepValues

MAX_RANK = 1 << 20  # ranks at or above this are ignored (state arrays are indexed by rank)


def score_arrays(
    cfg: DivergenceConfig,
    st: MetricState,
    sv: StepValues,
    columns: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[StepResult, int]:
    """One step scored with numpy, and how many values came from ranks outside
    0..MAX_RANK-1 (ignored). ``columns``: the step's (ranks, values) as arrays, in place of
    ``sv.values`` (a grid's row: no dict to build and read back)."""
    ignored = 0
    st.to_arrays()
    if columns is None:
        count = len(sv.values)
        ranks = np.fromiter(sv.values.keys(), np.int64, count)
        values = np.fromiter(sv.values.values(), np.float64, count)
    else:
        ranks, values = columns
        count = len(ranks)
    if count and (ranks.min() < 0 or ranks.max() >= MAX_RANK):
        keep = (ranks >= 0) & (ranks < MAX_RANK)
        ignored = int(count - keep.sum())
        ranks, values = ranks[keep], values[keep]
    if ranks.size:
        st.grow(int(ranks.max()), PY_MAX_RANKS)
    finite = np.isfinite(values)
    fin_ranks, fin_values = ranks[finite], values[finite]
    stats = _stats(sv, fin_values)
    in_order = st.last_step is None or sv.step > st.last_step
    if in_order:
        st.last_step = sv.step
    new: list[Divergence] = []
    resolved: list[Divergence] = []
    if not finite.all():
        bad_at = np.flatnonzero(~finite)
        bad = list(zip(ranks[bad_at].tolist(), values[bad_at].tolist(), strict=True))
        flag_nonfinite(st, sv, stats, bad, new)
    if in_order and st.active and any(k[1] == "nonfinite" for k in st.active):
        clear_nonfinite(cfg, st, sv.step, set(fin_ranks.tolist()), resolved)

    z, rel = _score(cfg, st, stats, fin_values)
    z_all = np.full(values.size, np.nan)
    rel_all = np.full(values.size, np.nan)
    z_all[finite], rel_all[finite] = z, rel
    rule = st.rule
    hi_ok = rule.direction in ("both", "high")
    lo_ok = rule.direction in ("both", "low")
    outlier = np.zeros(values.size, bool)
    if hi_ok or lo_ok:
        zt = cfg.z_threshold
        hi_ratio, lo_ratio = gates(rule, stats.n)
        hi = (z >= zt) & (rel >= hi_ratio) if hi_ok else False
        lo = (z <= -zt) & (rel <= lo_ratio) if lo_ok else False
        outlier[finite] = hi | lo
        if in_order and stats.n >= 2:
            _evidence(cfg, st, sv, stats, fin_ranks, fin_values, z, rel, new, resolved)
    if stats.n >= 2 and in_order:
        pair = stats.n == 2  # only a pair's own levels are learned, from lists
        learn_spread(
            cfg,
            st,
            stats,
            fin_ranks.tolist() if pair else [],
            fin_values.tolist() if pair else [],
        )
    flagged = frozenset(r for (r, _) in st.active)
    scores = RankScores(ranks, values, z_all, rel_all, outlier, flagged)
    return StepResult(stats, scores, new, resolved), ignored


def _score(
    cfg: DivergenceConfig, st: MetricState, stats: StepStats, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if stats.n == 0:
        return v.copy(), v.copy()
    med = stats.median
    absmed = abs(med)
    z = (v - med) / scale(cfg, st, stats)
    if stats.n == 2:
        rel = np.array(_rel_lists(v.tolist(), med))
    elif absmed > 0:
        rel = 1.0 + (v - med) / absmed
    else:
        rel = np.where(v == 0, 1.0, np.copysign(np.inf, v))
    return z, rel


def _evidence(
    cfg: DivergenceConfig,
    st: MetricState,
    sv: StepValues,
    stats: StepStats,
    ranks: np.ndarray,
    v: np.ndarray,
    z: np.ndarray,
    rel: np.ndarray,
    new: list[Divergence],
    resolved: list[Divergence],
) -> None:
    rule, step = st.rule, sv.step
    if stats.n == 2 and st.spread_steps < cfg.pair_warmup_steps:
        return  # a pair has no yardstick yet
    limit, allowance = cfg.limit_for(stats.n), cfg.z_allowance
    cap = limit / (cfg.confirm_steps if stats.n >= cfg.small_n else cfg.small_confirm_steps)
    hi_ratio, lo_ratio = gates(rule, stats.n)
    threshold = cfg.z_threshold
    sides = []
    for direction, ev, start, signed, gate, sums in (
        ("high", st.ev_hi, st.start_hi, z, rel >= hi_ratio, (st.run_hi, st.out_hi)),
        ("low", st.ev_lo, st.start_lo, -z, rel <= lo_ratio, (st.run_lo, st.out_lo)),
    ):
        if rule.direction not in ("both", direction):
            continue
        before = ev[ranks]
        # Clamped at the limit: a long fault must not leave evidence that outlives it.
        step_ev = np.minimum(signed - allowance, cap)
        # Evidence accrues only on steps where the rank is also materially away (past the
        # ratio gate); a significant but tiny deviation neither adds nor removes any.
        step_ev = np.where(gate | (step_ev < 0), step_ev, 0.0)
        after = np.clip(before + step_ev, 0.0, limit)
        ev[ranks] = after
        began = (before == 0) & (after > 0)
        if began.any():
            start[ranks[began]] = step
        live = after > 0
        if live.any():
            onset.note_arrays(*sums, ranks[live], step, signed[live], began[live], threshold)
        sides.append((direction, ev, gate))
    windowed = np.zeros((2, ranks.size), bool)  # high, low
    if cfg.window_steps and stats.n >= cfg.small_n:
        bounds = (hi_ratio, lo_ratio)
        for i, direction, since in window.step_arrays(
            cfg, st, step, ranks, z, rel, stats.n, bounds
        ):
            windowed[0 if direction == "high" else 1, i] = True
            window.mark_start(st, direction, int(ranks[i]), since)
    if st.active:
        pos = np.full(st.size, -1, np.int64)
        pos[ranks] = np.arange(ranks.size)
        at = {k[0]: int(pos[k[0]]) for k in st.active if k[1] == "outlier"}
        at = {r: i for r, i in at.items() if i >= 0}
        check_active(cfg, st, step, at, z, rel, stats.n, resolved)
    fresh = [
        (i, direction)
        for direction, ev, gate in sides
        for i in np.flatnonzero(
            ((ev[ranks] >= limit) & gate) | windowed[0 if direction == "high" else 1]
        ).tolist()
        if (int(ranks[i]), "outlier") not in st.active
    ]
    if fresh:
        if stats.n == 2:
            ranks, v = ranks.tolist(), v.tolist()
        new_outliers(cfg, st, sv, stats, fresh, ranks, v, z, rel, new)


def _stats(sv: StepValues, v: np.ndarray) -> StepStats:
    n = int(v.size)
    if n == 0:
        return no_stats(sv)
    # np.percentile and np.median, without their fixed cost: the order statistics they read,
    # by one partition each, combined as they combine them (lists.quantiles)
    plan = plan_for(n)
    kth = sorted({i for lo, hi, _ in plan for i in (lo, hi)})
    order = dict(zip(kth, np.partition(v, kth)[kth].tolist(), strict=True))
    p5, p25, med, p75, p95 = quantiles_at(plan, order)
    dev = np.abs(v - med)
    half = n >> 1
    if n & 1:
        mad = float(np.partition(dev, half)[half])
    else:
        lo, hi = np.partition(dev, (half - 1, half))[half - 1 : half + 1].tolist()
        mad = (lo + hi) / 2
    return StepStats(
        sv.run, sv.metric, sv.step, n, med, mad, float(v.mean()), float(v.min()), float(v.max()),
        p5, p25, p75, p95,
    )  # fmt: skip
