"""Per (run, metric) confirmation state, and the verdicts drawn from it.

Shared by both scoring paths of ``divergence.py`` (lists for small worlds, numpy for large
ones): whatever computed the z-scores, flagging, blaming and resolving happen here, the same
way. Per-rank sequences (``ranks``, ``v``, ``z``, ``rel``) may be lists or numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from rankwatch.aggregator.divergence import onset
from rankwatch.aggregator.divergence.config import DivergenceConfig, MetricRule
from rankwatch.aggregator.divergence.listing import ActiveFlags
from rankwatch.aggregator.divergence.robust import MAD_TO_SIGMA, robust_scale
from rankwatch.aggregator.divergence.types import Divergence, StepStats, new_divergence
from rankwatch.aggregator.merge import StepValues

Ints = Sequence[int] | np.ndarray  # a per-rank column: a list (small worlds) or an array
Floats = Sequence[float] | np.ndarray


class MetricState:
    """Evidence per rank and direction, spread and own-level history of one (run, metric).

    Per-rank state is indexed by rank: Python lists while every rank seen is below the
    detector's list limit, numpy arrays from the first step scored with numpy on.
    """

    def __init__(self, rule: MetricRule) -> None:
        self.rule = rule
        self.size = 0
        self.lists = True
        self.ev_hi: Any = []  # CUSUM evidence that the rank is above the others
        self.ev_lo: Any = []
        self.start_hi: Any = []  # step where the current evidence run began
        self.start_lo: Any = []
        # the run's sums of signed z and its first step past z_threshold (onset.py: the step
        # the flag is dated to): four per-rank rows, and one
        self.run_hi: Any = [[], [], [], []]
        self.run_lo: Any = [[], [], [], []]
        self.out_hi: Any = []
        self.out_lo: Any = []
        self.own: Any = []  # EWMA of log|x| per rank (pairs only), NaN until seen
        # window test (window.py): the last window_steps - 1 steps' additions per rank, most
        # recent first (lists of per-rank lists, or a 2-D array), and their step numbers
        self.win_hi: Any = []
        self.win_lo: Any = []
        # beside each addition, the rank's ratio past the gate on that step (rel - high gate,
        # low gate - rel; 0 where nothing was added): the window's ratio gate (window.py)
        self.gate_hi: Any = []
        self.gate_lo: Any = []
        self.win_steps: list[int] = []
        self.win_live = False  # lists only: some window holds an addition
        self.calm = True  # lists only: every evidence entry and window is zero
        self.spread: float | None = None  # EWMA of 1.4826 * MAD / |median|
        self.spread_steps = 0
        self.last_step: int | None = None
        self.active = ActiveFlags()  # (rank, kind) -> divergence
        self.clean: dict[tuple[int, str], int] = {}  # consecutive clean steps while active

    def grow(self, top: int, list_ranks: int) -> None:
        """Make room for rank ``top``; ranks >= ``list_ranks`` turn the state into arrays."""
        if top < self.size:
            return
        if self.lists and top < list_ranks:
            pad = max(top + 1, 8) - self.size
            self.ev_hi += [0.0] * pad
            self.ev_lo += [0.0] * pad
            self.start_hi += [0] * pad
            self.start_lo += [0] * pad
            for row in (*self.run_hi, *self.run_lo):
                row += [0.0] * pad
            self.out_hi += [onset.NONE] * pad
            self.out_lo += [onset.NONE] * pad
            self.own += [math.nan] * pad
            for row in self.window_rows():
                row += [0.0] * pad
            self.size += pad
            return
        self.to_arrays()
        size = max(top + 1, 2 * self.size, 8)
        pad = size - self.size
        self.ev_hi = np.concatenate([self.ev_hi, np.zeros(pad)])
        self.ev_lo = np.concatenate([self.ev_lo, np.zeros(pad)])
        self.start_hi = np.concatenate([self.start_hi, np.zeros(pad, np.int64)])
        self.start_lo = np.concatenate([self.start_lo, np.zeros(pad, np.int64)])
        self.run_hi, self.run_lo = (
            np.concatenate([run, np.zeros((4, pad))], axis=1) for run in (self.run_hi, self.run_lo)
        )
        self.out_hi, self.out_lo = (
            np.concatenate([out, np.full(pad, onset.NONE, np.int64)])
            for out in (self.out_hi, self.out_lo)
        )
        self.own = np.concatenate([self.own, np.full(pad, np.nan)])
        self.win_hi, self.win_lo, self.gate_hi, self.gate_lo = (
            np.concatenate([rows, np.zeros((len(rows), pad))], axis=1)
            for rows in (self.win_hi, self.win_lo, self.gate_hi, self.gate_lo)
        )
        self.size = size

    def to_arrays(self) -> None:
        if self.lists:
            self.lists = False
            self.ev_hi = np.array(self.ev_hi, np.float64)
            self.ev_lo = np.array(self.ev_lo, np.float64)
            self.start_hi = np.array(self.start_hi, np.int64)
            self.start_lo = np.array(self.start_lo, np.int64)
            self.run_hi, self.run_lo = (
                np.array(run, np.float64).reshape(4, self.size)
                for run in (self.run_hi, self.run_lo)
            )
            self.out_hi = np.array(self.out_hi, np.int64)
            self.out_lo = np.array(self.out_lo, np.int64)
            self.own = np.array(self.own, np.float64)
            self.win_hi, self.win_lo, self.gate_hi, self.gate_lo = (
                np.array(rows, np.float64).reshape(len(rows), self.size)
                for rows in (self.win_hi, self.win_lo, self.gate_hi, self.gate_lo)
            )

    def window_rows(self) -> tuple[Any, ...]:
        """Every per-rank row of the window test (additions and their gate margins)."""
        return (*self.win_hi, *self.win_lo, *self.gate_hi, *self.gate_lo)


def gates(rule: MetricRule, n: int) -> tuple[float, float]:
    """The (high, low) ratio gates of a step with ``n`` finite ranks."""
    if n == 2:
        pair = rule.pair_ratio or 1.0
        return pair, 1.0 / pair
    return rule.high_ratio or 1.0, rule.low_ratio or 0.0


def scale(cfg: DivergenceConfig, st: MetricState, stats: StepStats) -> float:
    """The z-score denominator of this step (``robust.robust_scale``)."""
    typical = st.spread if st.spread is not None else 0.0
    return robust_scale(cfg, st.rule, stats.n, stats.median, stats.mad, typical)


def learn_spread(
    cfg: DivergenceConfig,
    st: MetricState,
    stats: StepStats,
    ranks: Ints,
    v: Floats,
) -> None:
    """Update the typical spread (and a pair's own levels: ``ranks``, ``v`` read for n == 2)."""
    if stats.median == 0:
        return
    if stats.n == 2:
        # A pair learns its spread and levels only on quiet steps: a fault must not become
        # the new normal while it is being confirmed.
        ev_hi, ev_lo = st.ev_hi, st.ev_lo
        if st.active or any(ev_hi[r] or ev_lo[r] for r in ranks):
            return
        a, own = cfg.history_alpha, st.own
        for r, x in zip(ranks, v, strict=True):
            log_x = math.log(abs(x)) if x != 0 else math.nan
            old = own[r]
            own[r] = log_x if math.isnan(old) else (1 - a) * old + a * log_x
    measured = MAD_TO_SIGMA * stats.mad / abs(stats.median)
    if st.spread is None:
        st.spread = measured
    else:
        st.spread += cfg.spread_alpha * (measured - st.spread)
    st.spread_steps += 1


def flag_nonfinite(
    st: MetricState,
    sv: StepValues,
    stats: StepStats,
    bad: list[tuple[int, float]],
    new: list[Divergence],
) -> None:
    """Flag each (rank, value) of ``bad`` at once, unless it is flagged already.

    In a cascade ``bad`` is every rank: the flags go in with one update (one version of
    ``st.active``), and a flag's message is its rank before the step's shared words."""
    active, clean = st.active, st.clean
    run, metric, step, median, n = sv.run, sv.metric, sv.step, stats.median, stats.n
    note = f" (median of the other ranks {median:.4g})" if n else ""
    tails = {w: f" {metric} is {w} at step {step}{note}" for w in ("NaN", "+Inf", "-Inf")}
    nan = math.nan
    made: dict[tuple[int, str], Divergence] = {}
    for rank, value in bad:
        k = (rank, "nonfinite")
        if clean:
            clean.pop(k, None)
        if k in active or k in made:
            continue
        word = "NaN" if value != value else ("+Inf" if value > 0 else "-Inf")
        made[k] = new_divergence(
            run, metric, rank, "nonfinite", "low" if value < 0 else "high", step, step, value,
            median, nan, nan, f"rank {rank}{tails[word]}", n, True,
        )  # fmt: skip
    if made:
        active.update(made)
        new.extend(made.values())


def clear_nonfinite(
    cfg: DivergenceConfig,
    st: MetricState,
    step: int,
    finite_ranks: set[int],
    resolved: list[Divergence],
) -> None:
    for k in [k for k in st.active if k[1] == "nonfinite" and k[0] in finite_ranks]:
        tick_clean(cfg, st, k, step, resolved, "finite again")


def tick_clean(
    cfg: DivergenceConfig,
    st: MetricState,
    k: tuple[int, str],
    step: int,
    resolved: list[Divergence],
    why: str,
) -> None:
    count = st.clean.get(k, 0) + 1
    if count < cfg.clear_steps:
        st.clean[k] = count
        return
    st.clean.pop(k, None)
    d = st.active.pop(k)
    resolved.append(replace(d, step=step, message=f"{d.message}; {why} at step {step}"))
    if k[1] == "outlier" and k[0] < st.size:
        st.ev_hi[k[0]] = st.ev_lo[k[0]] = 0.0
        for row in st.window_rows():  # old window additions must not re-flag it
            row[k[0]] = 0.0


def check_active(
    cfg: DivergenceConfig,
    st: MetricState,
    step: int,
    at: Mapping[int, int],
    z: Floats,
    rel: Floats,
    n: int,
    resolved: list[Divergence],
) -> None:
    """Tick the flagged outliers reported this step (``at``: rank -> index) toward clear."""
    allowance = cfg.z_allowance
    hi_ratio, lo_ratio = gates(st.rule, n)
    for k, d in list(st.active.items()):
        i = at.get(k[0])
        if k[1] != "outlier" or i is None:
            continue  # not reported this step: nothing learned
        if d.direction == "high":
            clean = z[i] < allowance or rel[i] < hi_ratio
        else:
            clean = -z[i] < allowance or rel[i] > lo_ratio
        if clean:
            tick_clean(cfg, st, k, step, resolved, "back with the others")
        else:
            st.clean.pop(k, None)


def new_outliers(
    cfg: DivergenceConfig,
    st: MetricState,
    sv: StepValues,
    stats: StepStats,
    fresh: list[tuple[int, str]],
    ranks: Ints,
    v: Floats,
    z: Floats,
    rel: Floats,
    new: list[Divergence],
) -> None:
    """Flag the ``fresh`` (index, direction) pairs whose evidence reached the limit."""
    moved = None
    if stats.n == 2:
        fresh, moved = _blame_pair(cfg, st, ranks, v, fresh)
    for i, direction in fresh:
        rank = int(ranks[i])
        since = onset_of(st, direction, rank, sv.step)
        d = _outlier(cfg, sv, stats, rank, direction, since, v, z, rel, i, ranks, moved)
        st.active[(rank, "outlier")] = d
        new.append(d)


def onset_of(st: MetricState, direction: str, rank: int, step: int) -> int:
    """The step ``rank``'s divergence in ``direction``, flagged at ``step``, is dated to."""
    if direction == "high":
        start, out, run = st.start_hi, st.out_hi, st.run_hi
    else:
        start, out, run = st.start_lo, st.out_lo, st.run_lo
    sums = (float(run[0][rank]), float(run[1][rank]), float(run[2][rank]), float(run[3][rank]))
    return onset.since(int(start[rank]), int(out[rank]), sums, step)


def _blame_pair(
    cfg: DivergenceConfig,
    st: MetricState,
    ranks: Ints,
    v: Floats,
    fresh: list[tuple[int, str]],
) -> tuple[list[tuple[int, str]], list[float]]:
    """Of two disagreeing ranks, keep the one that moved from its own recent level."""
    moved = []
    for r, x in zip(ranks, v, strict=True):
        m = abs((math.log(abs(x)) if x != 0 else math.inf) - st.own[r])
        moved.append(math.inf if math.isnan(m) else m)  # no own history: unknown
    if any((r, "outlier") in st.active for r in ranks):
        return [], moved  # the pair is already explained
    if len(fresh) == 2:
        i = 0 if moved[0] >= moved[1] else 1
        return [c for c in fresh if c[0] == i], moved
    i = fresh[0][0]
    other = 1 - i
    if math.isfinite(moved[other]) and moved[other] >= cfg.blame_factor * moved[i]:
        return [], moved  # the other rank changed (e.g. its throughput went up)
    return fresh, moved


def _outlier(
    cfg: DivergenceConfig,
    sv: StepValues,
    stats: StepStats,
    rank: int,
    direction: str,
    since: int,
    v: Floats,
    z: Floats,
    rel: Floats,
    i: int,
    ranks: Ints,
    moved: list[float] | None,
) -> Divergence:
    value, zi, ri = float(v[i]), float(z[i]), float(rel[i])
    confident = True
    if moved is not None:
        other = 1 - i
        confident = bool(
            math.isfinite(moved[other]) and moved[i] >= cfg.blame_factor * moved[other]
        )
        o_rank = int(ranks[other])
        pair_ratio = value / float(v[other]) if v[other] != 0 else math.inf
        message = (
            f"rank {rank} {sv.metric} {_ratio(pair_ratio)} rank {o_rank} (2 ranks; "
            f"rank {rank} moved {_ratio(math.exp(moved[i]))} from its own recent level, "
            f"rank {o_rank} {_ratio(math.exp(moved[other]))}"
            + ("" if confident else "; cannot tell which rank changed")
            + f") since step {since}"
        )
    else:
        message = (
            f"rank {rank} {sv.metric} {_ratio(ri)} the median of {stats.n} ranks "
            f"(z={zi:.1f}) since step {since}"
        )
    return Divergence(
        sv.run, sv.metric, rank, "outlier", direction, since, sv.step, value,
        stats.median, zi, ri, message, stats.n, confident,
    )  # fmt: skip


def _ratio(r: float) -> str:
    if not math.isfinite(r):
        return "inf x"
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"
