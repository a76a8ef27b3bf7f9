"""Many steps of one small world at once: the step statistics of every step in a few numpy
calls, then only the steps where something may happen go through the detector one by one.

Why: a batched frame completes dozens of steps at a time, and nearly every step is quiet (no
rank past the CUSUM allowance, no evidence held). Scored one by one, each step's cost at 8
ranks is mostly the statistics. Here the statistics of a whole run of steps are computed
column-wise, bit for bit as ``divergence_lists.step_stats`` computes them for one step (same
sort, same quantile formula, numpy's summation order), so a quiet step's verdict, spread update
and scores are exactly the sequential path's. A step that is not quiet, not in order, or has a
non-finite value is handed to the sequential path, in order, so state is never out of step.

Pure: no sockets, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.lists import (
    PAIRWISE_BLOCK,
    no_outliers,
    quantile_plan,
    rel_list,
)
from rankwatch.aggregator.divergence.robust import SLACK_RANKS, mad_slack, small_sample_factor
from rankwatch.aggregator.divergence.state import MAD_TO_SIGMA, MetricState
from rankwatch.aggregator.divergence.types import (
    RankScores,
    StepResult,
    StepStats,
    new_result,
    new_stats,
)

MIN_BATCH_STEPS = 4  # fewer steps than this are scored one by one (numpy's fixed cost)
MIN_BATCH_RANKS = 3  # pairs learn per-rank levels on every step: always one by one
_NO_STEP = -(2**63)  # below every step the schema allows but this one


def block_columns(v: np.ndarray) -> list[np.ndarray]:
    """Per row of the finite ``v`` (steps x ranks): [median, mad, mean, min, max, p5, p25,
    p75, p95] as float64 columns, each value equal to ``step_stats(row)``'s. ``v`` may also be
    steps x ranks x metrics (a grid's metrics at once: a few numpy calls for all of them),
    giving steps x metrics columns."""
    n = v.shape[1]
    s = np.sort(v, axis=1)
    q = []
    for lo, hi, gamma in quantile_plan(n):
        a, b = s[:, lo], s[:, hi]
        diff = b - a
        q.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    p5, p25, med, p75, p95 = q
    dev = np.sort(np.abs(s - np.expand_dims(med, 1)), axis=1)
    half = n >> 1
    mad = dev[:, half] if n & 1 else (dev[:, half - 1] + dev[:, half]) / 2
    mean = _np_sum_rows(v) / n
    return [med, mad, mean, s[:, 0], s[:, -1], p5, p25, p75, p95]


def finite_columns(v: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(which rows of ``v`` are all finite, ``block_columns`` of v): a row with a NaN or Inf
    gets statistics of zeros in its place (such a step is scored one by one)."""
    ok = np.isfinite(v)
    finite = ok.all(axis=1)
    return finite, block_columns(v if finite.all() else np.where(ok, v, 0.0))


def _np_sum_rows(v: np.ndarray) -> np.ndarray:
    """``divergence_lists.np_sum`` of every row: the same additions in the same order."""
    n = v.shape[1]
    if n > PAIRWISE_BLOCK:
        raise ValueError(f"rows of at most {PAIRWISE_BLOCK} values, got {n}")
    if n < 8:
        total = np.zeros(v.shape[:1] + v.shape[2:])
        for j in range(n):
            total = total + v[:, j]
        return total
    whole = n - n % 8
    r = [v[:, j].copy() for j in range(8)]
    for i in range(8, whole, 8):
        for j in range(8):
            r[j] += v[:, i + j]
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(whole, n):
        total = total + v[:, i]
    return total


class QuietSteps:
    """Consecutive quiet steps of one (run, metric), scored column-wise: nothing flagged,
    resolved or outlying. Holds what their StepResults would, built only when asked
    (``results()``); the dashboard reads only the latest step's scores (``last_scores()``) and
    the alert rules only the statistics of metrics they watch (``stats()``)."""

    __slots__ = ("_at", "_cols", "_scales", "_v", "metric", "ranks", "run", "steps")

    def __init__(
        self,
        run: str,
        metric: str,
        ranks: list[int],
        v: np.ndarray,
        cols: list[np.ndarray],
        steps: list[int],
        at: range,
        scales: list[float],
    ) -> None:
        self.run, self.metric, self.ranks, self.steps = run, metric, ranks, steps
        self._v = v  # steps x ranks, of which rows ``_at`` are these steps
        self._cols = cols  # block_columns(v): step_stats() of each row of v, as columns
        self._at = at
        self._scales = scales

    def __len__(self) -> int:
        return len(self.steps)

    def stats(self) -> list[StepStats]:
        run, metric, n, at = self.run, self.metric, len(self.ranks), self._at
        rows = zip(*(col[at.start : at.stop].tolist() for col in self._cols), strict=True)
        return [
            new_stats(run, metric, step, n, *row)
            for step, row in zip(self.steps, rows, strict=True)
        ]

    def _scores(self, i: int) -> RankScores:
        at = self._at[i]
        values, med, sc = self._v[at].tolist(), float(self._cols[0][at]), self._scales[i]
        fill = _filler(values, med, sc)
        return RankScores.lazy(self.ranks, values, no_outliers(len(values)), fill)

    def last_scores(self) -> RankScores:
        return self._scores(-1)

    def results(self) -> list[StepResult]:
        """The StepResult of each step, equal to what ``update`` returned for it."""
        return [new_result(s, self._scores(i), [], []) for i, s in enumerate(self.stats())]


def score_run(
    cfg: DivergenceConfig,
    st: MetricState,
    key: tuple[str, str],
    ranks: list[int],
    steps: Sequence[int],
    v: np.ndarray,
    one_by_one: Callable[[int], StepResult],
    stats: tuple[np.ndarray, list[np.ndarray]] | None = None,
) -> list[StepResult | QuietSteps]:
    """The detector's ``update`` of each step of one (run, metric) = ``key``, with runs of quiet
    steps as one ``QuietSteps`` each: the same verdicts and state. ``v[i]``: the values of
    ``ranks`` (the same ranks in the same order at every step, at least MIN_BATCH_RANKS, all in
    the list-scoring range, ``st.grow`` done) at ``steps[i]``; ``one_by_one(i)`` scores step
    ``i`` with ``update``; ``stats``: ``finite_columns(v)`` if already computed."""
    finite, cols = finite_columns(v) if stats is None else stats
    scan = _QuietScan(cfg, st, steps, finite, cols, len(ranks))
    may_be_quiet = cfg.quiet_below <= cfg.z_threshold
    out: list[StepResult | QuietSteps] = []
    i, n = 0, len(steps)
    while i < n:
        if may_be_quiet and st.calm and not st.active:
            end, scales, spread, learned = scan.quiet_until(i, st.spread, st.last_step)
            if end > i:
                at = range(i, end)
                out.append(QuietSteps(*key, ranks, v, cols, list(steps[i:end]), at, scales))
                st.spread, st.spread_steps = spread, st.spread_steps + learned
                st.last_step = steps[end - 1]
                i = end
                continue
        out.append(one_by_one(i))
        i += 1
    return out


class _QuietScan:
    """Which steps from ``i`` on are quiet, column-wise: ``scale`` and ``learn_spread`` of a
    step of 3+ ranks with the same arithmetic on the same floats in the same order, so the
    verdicts, scales and spread are the sequential path's bit for bit. Only the spread's
    moving average runs step by step (each step's scale needs the spread before it), in a
    tight loop; the rest is a few numpy calls per run of quiet steps (a Python loop over every
    step's statistics is too slow for batched frames: docs/benchmarks.md, Ingest)."""

    def __init__(
        self,
        cfg: DivergenceConfig,
        st: MetricState,
        steps: Sequence[int],
        finite: np.ndarray,
        cols: list[np.ndarray],
        n: int,
    ) -> None:
        med, mad, lo, hi = cols[0], cols[1], cols[3], cols[4]
        rule = st.rule
        self.rel_floor, self.abs_floor = rule.rel_floor or 0.0, rule.abs_floor or cfg.abs_floor
        # robust_scale's pooled factor, multiplied in the same order
        self.pool = cfg.spread_pool * small_sample_factor(n)
        self.slack = mad_slack(n) if n >= SLACK_RANKS else 1.0
        self.alpha, self.allowance = cfg.spread_alpha, cfg.quiet_below
        self.steps = np.asarray(steps, dtype=np.int64)
        self.finite = finite
        self.mad_sigma = MAD_TO_SIGMA * mad
        self.absmed = np.abs(med)
        self.up, self.down = hi - med, med - lo
        self.learns = med != 0  # learn_spread learns nothing from a zero median
        with np.errstate(divide="ignore", invalid="ignore"):
            # learn_spread's measurement; NaN where nothing is learned
            self.measured = np.where(self.learns, self.mad_sigma / self.absmed, math.nan).tolist()

    def quiet_until(
        self, i: int, spread: float | None, last: int | None
    ) -> tuple[int, list[float], float | None, int]:
        """(end, the scales of steps i..end-1, the spread after them, how many of them taught
        the spread): steps i..end-1 are quiet, step ``end`` (if < n) is not."""
        alpha = self.alpha
        before: list[float | None] = []
        for x in self.measured[i:]:  # the spread before each step, were all of them quiet
            before.append(spread)
            if x == x:
                spread = x if spread is None else spread + alpha * (x - spread)
        # once learned, the spread stays a float: only the first steps can have none yet
        typical = np.array(
            before if before[0] is not None else [0.0 if s is None else s for s in before]
        )
        n = len(self.finite)
        # Python's max() and np.fmax agree here: no operand is NaN except pool * typical,
        # which both skip (max keeps the first operand; fmax the other).
        own = self.mad_sigma[i:]
        if self.slack != 1.0:  # robust_scale's shrunk own MAD
            own = np.where(typical > 0, own / self.slack, own)
        sc = np.fmax(
            np.fmax(own, self.absmed[i:] * np.fmax(self.rel_floor, self.pool * typical)),
            self.abs_floor,
        )
        steps = self.steps[i:]
        prev = np.empty_like(steps)  # a quiet step becomes ``last`` for the next one
        prev[0] = _NO_STEP if last is None else last  # step _NO_STEP itself: one by one
        prev[1:] = steps[:-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            quiet = (
                self.finite[i:]
                & (steps > prev)
                & (sc > 0)
                & (self.up[i:] / sc < self.allowance)
                & (self.down[i:] / sc < self.allowance)
            )
        stop = np.flatnonzero(~quiet)
        k = int(stop[0]) if len(stop) else n - i
        after = before[k] if k < n - i else spread
        learned = int(np.count_nonzero(self.learns[i : i + k]))
        return i + k, sc[:k].tolist(), after, learned


def _filler(values: list[float], med: float, sc: float) -> Callable[[], tuple[list, list]]:
    def fill() -> tuple[list[float], list[float]]:
        return [(x - med) / sc for x in values], rel_list(values, med)

    return fill
