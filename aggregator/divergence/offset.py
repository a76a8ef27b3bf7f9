"""Persistent offset: one rank's metric a little off the others' on every step.

The per-step robust z and its CUSUM (``small``, ``large``) cannot see a shift below the CUSUM's
allowance, however long it lasts: a card computing its gradients a little too large (silent
data corruption) hides in the step-to-step noise of the local gradient norms of data-parallel
ranks, which see different batches. Its log ratio to the median of the OTHER ranks, though, is
offset by the same amount on every step while each step's noise is not: averaged over
``offset_steps`` steps the noise shrinks by ``sqrt(offset_steps)`` and the offset stays.

For the metrics whose rule sets ``offset_steps``, with at least 3 ranks: per rank, the mean of
its last ``offset_steps`` log ratios. On clean data that mean is 0 with standard deviation
``sigma / sqrt(offset_steps)``, ``sigma`` the ranks' pooled standard deviation of their log
ratios around their own window means (an offset that lasts does not widen it), averaged over
the run's steps (an EWMA of weight ``1 / offset_steps``). A rank whose
mean passes ``OFFSET_Z`` of those standard deviations (raised with the world like the CUSUM
limit: ``DivergenceConfig.limit_for``) and the rule's ratio gate is flagged, kind ``offset``;
it resolves after ``clear_steps`` steps below half of that. A rank flagged as an outlier is
not flagged again while it is or its window still holds those steps. Pure.
"""

from __future__ import annotations

import math
from collections import deque

from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.state import MetricState, gates, tick_clean
from rankwatch.aggregator.divergence.types import Divergence, StepStats
from rankwatch.aggregator.merge import StepValues

OFFSET_Z = 5.0  # standard deviations of the window mean that flag, in worlds up to evidence_ranks
MIN_RANKS = 3  # a pair's log ratios are each other's negatives: no way to tell which moved
KIND = "offset"


class OffsetState:
    """Each rank's last log ratios of one (run, metric)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.logs: dict[int, deque[float]] = {}
        self.var: float | None = None  # EWMA of the pooled variance around the window means
        self.seen = 0  # steps that updated ``var``
        self.outlier_at: dict[int, int] = {}  # rank -> last step it was flagged as an outlier
        self.last_step: int | None = None


def others_medians(values: list[float]) -> list[float]:
    """For each value, the median of all the OTHER values (at least 2 values)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    a = [values[i] for i in order]
    m = len(a) - 1  # the others' count
    out = [0.0] * len(a)
    for pos, i in enumerate(order):
        if m % 2:  # odd: the middle one of the others
            k = m // 2
            out[i] = a[k] if pos > k else a[k + 1]
        else:
            lo, hi = m // 2 - 1, m // 2
            x = a[lo] if pos > lo else a[lo + 1]
            y = a[hi] if pos > hi else a[hi + 1]
            out[i] = (x + y) / 2
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
    ranks = [r for r, x in sv.values.items() if x > 0 and math.isfinite(x)]
    if len(ranks) < MIN_RANKS:
        return
    values = [sv.values[r] for r in ranks]
    w = ost.steps
    full: list[tuple[int, float, float]] = []  # (rank, value, window mean) of full windows
    spreads = []
    for r, x, o in zip(ranks, values, others_medians(values), strict=True):
        window = ost.logs.get(r)
        if window is None:
            window = ost.logs[r] = deque(maxlen=w)
        window.append(math.log(x / o))
        if len(window) == w:
            mean = sum(window) / w
            full.append((r, x, mean))
            spreads.append(sum((y - mean) ** 2 for y in window) / (w - 1))
    if len(full) < MIN_RANKS:
        return
    # Each rank's spread around its OWN window mean: the bad rank's offset, and the one it gives
    # the others through their median, do not widen it. Averaged over more steps than one
    # window, so a window that happens to be calm does not make its own mean look large.
    var = max(sum(spreads) / len(spreads), (st.rule.rel_floor or 0.0) ** 2)
    ost.var = var if ost.var is None else ost.var + (var - ost.var) / w
    ost.seen += 1
    if ost.seen >= w:
        _test(cfg, st, ost, sv, stats, full, math.sqrt(ost.var / w), new, resolved)


def _test(
    cfg: DivergenceConfig,
    st: MetricState,
    ost: OffsetState,
    sv: StepValues,
    stats: StepStats,
    full: list[tuple[int, float, float]],
    sd: float,
    new: list[Divergence],
    resolved: list[Divergence],
) -> None:
    rule, n = st.rule, len(full)
    w = int(rule.offset_steps or 0)
    limit = OFFSET_Z + cfg.limit_for(n) - cfg.evidence_limit
    hi_ratio, lo_ratio = gates(rule, n)
    for r, x, mean in full:
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
        if (r, "outlier") in st.active:
            ost.outlier_at[r] = sv.step
            continue
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
