"""Persistent offset: one rank's metric a little off the others' on every step.

The per-step robust z and its CUSUM (``small``, ``large``) cannot see a shift below the CUSUM's
allowance, however long it lasts: a card computing its gradients a little too large (silent
data corruption) hides in the step-to-step noise of the local gradient norms of data-parallel
ranks, which see different batches. Its log ratio to the median of the OTHER ranks, though, is
offset by the same amount on every step while each step's noise is not: averaged over
``offset_steps`` steps the noise shrinks by ``sqrt(offset_steps)`` and the offset stays.

For the metrics whose rule sets ``offset_steps``, with at least 3 ranks: per rank, the mean of
its last ``offset_steps`` log ratios (to the others that are not flagged). On clean data that
mean is 0 with standard deviation ``sigma / sqrt(offset_steps)``, ``sigma`` the ranks' pooled
standard deviation of their log ratios around their own window means (an offset that lasts
does not widen it), averaged over the run's steps (an EWMA of weight ``1 / offset_steps``). A
rank whose mean passes ``OFFSET_Z`` of those standard deviations (raised with the world like
the CUSUM limit: ``DivergenceConfig.grown_limit``) and the rule's ratio gate is flagged, kind
``offset``; it resolves after ``clear_steps`` steps below half of that. A rank flagged as an
outlier is not flagged again while it is or its window still holds those steps. Pure.
"""

from __future__ import annotations

import math

import numpy as np
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.state import MetricState, gates, tick_clean
from rankwatch.aggregator.divergence.types import Divergence, StepStats
from rankwatch.aggregator.merge import StepValues

OFFSET_Z = 5.0  # standard deviations of the window mean that flag, in worlds up to evidence_ranks
MIN_RANKS = 3  # a pair's log ratios are each other's negatives: no way to tell which moved
KIND = "offset"


class OffsetState:
    """Each rank's last log ratios (a ring of ``steps`` per rank) of one (run, metric)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.logs = np.zeros((0, steps))  # rank -> its last log ratios, in ring order
        self.count = np.zeros(0, np.int64)  # log ratios each rank has added
        self.var: float | None = None  # EWMA of the pooled variance around the window means
        self.seen = 0  # steps that updated ``var``
        self.outlier_at: dict[int, int] = {}  # rank -> last step it was flagged as an outlier
        self.last_step: int | None = None

    def grow(self, top: int) -> None:
        if top >= len(self.count):
            pad = max(top + 1, 2 * len(self.count), 8) - len(self.count)
            self.logs = np.vstack([self.logs, np.zeros((pad, self.steps))])
            self.count = np.concatenate([self.count, np.zeros(pad, np.int64)])


def others_medians(values: np.ndarray) -> np.ndarray:
    """For each value, the median of all the OTHER values (at least 2 values)."""
    n = len(values)
    order = np.argsort(values, kind="stable")
    a = values[order]
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    m = n - 1  # the others' count
    if m % 2:  # odd: the middle one of the others
        k = m // 2
        return np.where(pos > k, a[k], a[k + 1])
    lo, hi = m // 2 - 1, m // 2
    return (np.where(pos > lo, a[lo], a[lo + 1]) + np.where(pos > hi, a[hi], a[hi + 1])) / 2


def references(st: MetricState, ranks: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each rank's reference: the median of the other ranks that are not flagged. A flagged
    rank drags the others' medians its way; left in, it would give every other rank a lasting
    offset of its own."""
    if not st.active:
        return others_medians(values)
    bad = {r for r, _ in st.active}
    clean = np.fromiter((r not in bad for r in ranks.tolist()), bool, len(ranks))
    if int(clean.sum()) < MIN_RANKS:
        return others_medians(values)
    out = np.full(len(values), float(np.median(values[clean])))
    out[clean] = others_medians(values[clean])
    return out


def observe(
    cfg: DivergenceConfig,
    st: MetricState,
    ost: OffsetState,
    sv: StepValues,
    stats: StepStats,
    new: list[Divergence],
    resolved: list[Divergence],
) -> None:
    """Score one step: flags go to ``new`` (and ``st.active``), resolutions to ``resolved``."""
    if ost.last_step is not None and sv.step <= ost.last_step:
        return  # a late step: its window has moved on
    ost.last_step = sv.step
    ranks = np.fromiter(sv.values.keys(), np.int64, len(sv.values))
    values = np.fromiter(sv.values.values(), np.float64, len(sv.values))
    keep = (values > 0) & np.isfinite(values) & (ranks >= 0)
    ranks, values = ranks[keep], values[keep]
    if len(ranks) < MIN_RANKS:
        return
    w = ost.steps
    ost.grow(int(ranks.max()))
    ost.logs[ranks, ost.count[ranks] % w] = np.log(values / references(st, ranks, values))
    ost.count[ranks] += 1
    full = ost.count[ranks] >= w
    if int(full.sum()) < MIN_RANKS:
        return
    ranks, values = ranks[full], values[full]
    windows = ost.logs[ranks]
    means = windows.mean(axis=1)
    # Each rank's spread around its OWN window mean: the bad rank's offset, and the one it gives
    # the others through their median, do not widen it. Averaged over more steps than one
    # window, so a window that happens to be calm does not make its own mean look large.
    spread = float(((windows - means[:, None]) ** 2).sum() / (len(ranks) * (w - 1)))
    var = max(spread, (st.rule.rel_floor or 0.0) ** 2)
    ost.var = var if ost.var is None else ost.var + (var - ost.var) / w
    ost.seen += 1
    if ost.seen < w:
        return
    sd = math.sqrt(ost.var / w)
    limit = OFFSET_Z + cfg.grown_limit(len(ranks)) - cfg.evidence_limit
    # Only the ranks past half the limit can flag; the flagged ones are looked at too, to count
    # their clean steps.
    look = set(np.flatnonzero(np.abs(means) >= limit / 2 * sd).tolist())
    if st.active:
        at = {r: i for i, r in enumerate(ranks.tolist())}
        for r, kind in st.active:
            if kind == "outlier":
                ost.outlier_at[r] = sv.step
            elif kind == KIND and r in at:
                look.add(at[r])
    picked = [(int(ranks[i]), float(values[i]), float(means[i])) for i in sorted(look)]
    _test(cfg, st, ost, sv, stats, picked, len(ranks), sd, limit, new, resolved)


def _test(
    cfg: DivergenceConfig,
    st: MetricState,
    ost: OffsetState,
    sv: StepValues,
    stats: StepStats,
    picked: list[tuple[int, float, float]],
    n: int,
    sd: float,
    limit: float,
    new: list[Divergence],
    resolved: list[Divergence],
) -> None:
    """Flag or tick ``picked`` (rank, value, window mean) of the ``n`` ranks scored."""
    rule, w = st.rule, ost.steps
    hi_ratio, lo_ratio = gates(rule, n)
    for r, x, mean in picked:
        z = mean / sd if sd > 0 else math.copysign(math.inf, mean)
        k = (r, KIND)
        if k in st.active:
            if abs(z) < limit / 2:
                tick_clean(cfg, st, k, sv.step, resolved, "back with the others")
            else:
                st.clean.pop(k, None)
            continue
        direction = "high" if mean > 0 else "low"
        ratio = math.exp(mean)
        if abs(z) < limit or sv.step - ost.outlier_at.get(r, -w) < w:
            continue  # (an outlier's window is still in the mean: it was reported already)
        if rule.direction not in ("both", direction):
            continue
        if not (ratio >= hi_ratio if direction == "high" else ratio <= lo_ratio):
            continue
        since = sv.step - w + 1
        d = Divergence(
            sv.run, sv.metric, r, KIND, direction, since, sv.step, x, stats.median, z, ratio,
            f"rank {r} {sv.metric} {ratio:.2f}x the median of the other {n - 1} ranks on "
            f"average over {w} steps ({abs(z):.1f} sd of that average) since step {since}",
            n,
        )  # fmt: skip
        st.active[k] = d
        new.append(d)
