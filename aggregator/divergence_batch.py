"""Many steps of one small world at once: the step statistics of every step in a few numpy
calls, then only the steps where something may happen go through the detector one by one.

Why: a batched frame completes dozens of steps at a time, and nearly every step is quiet (no
rank past the CUSUM allowance, no evidence held). Scored one by one, each costs ~6 µs at 8
ranks, most of it the statistics. Here the statistics of a whole run of steps are computed
column-wise, bit for bit as ``divergence_lists.step_stats`` computes them for one step (same
sort, same quantile formula, numpy's summation order), so a quiet step's verdict, spread update
and scores are exactly the sequential path's. A step that is not quiet, not in order, or has a
non-finite value is handed to the sequential path, in order, so state is never out of step.

Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from rankwatch.aggregator.divergence_config import DivergenceConfig
from rankwatch.aggregator.divergence_lists import (
    PAIRWISE_BLOCK,
    no_outliers,
    quantile_plan,
    rel_list,
)
from rankwatch.aggregator.divergence_state import MAD_TO_SIGMA, MetricState
from rankwatch.aggregator.divergence_types import (
    RankScores,
    StepResult,
    StepStats,
    new_result,
    new_stats,
)

MIN_BATCH_STEPS = 4  # fewer steps than this are scored one by one (numpy's fixed cost)
MIN_BATCH_RANKS = 3  # pairs learn per-rank levels on every step: always one by one


def block_stats(v: np.ndarray) -> list[list[float]]:
    """Per row of the finite ``v`` (steps x ranks): [median, mad, mean, min, max, p5, p25,
    p75, p95] as columns of Python floats, each equal to ``step_stats(row)``'s."""
    n = v.shape[1]
    s = np.sort(v, axis=1)
    q = []
    for lo, hi, gamma in quantile_plan(n):
        a, b = s[:, lo], s[:, hi]
        diff = b - a
        q.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    p5, p25, med, p75, p95 = q
    dev = np.sort(np.abs(s - med[:, None]), axis=1)
    half = n >> 1
    mad = dev[:, half] if n & 1 else (dev[:, half - 1] + dev[:, half]) / 2
    mean = _np_sum_rows(v) / n
    cols = (med, mad, mean, s[:, 0], s[:, -1], p5, p25, p75, p95)
    return [c.tolist() for c in cols]


def _np_sum_rows(v: np.ndarray) -> np.ndarray:
    """``divergence_lists.np_sum`` of every row: the same additions in the same order."""
    n = v.shape[1]
    if n > PAIRWISE_BLOCK:
        raise ValueError(f"rows of at most {PAIRWISE_BLOCK} values, got {n}")
    if n < 8:
        total = np.zeros(v.shape[0])
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

    __slots__ = ("_at", "_rows", "_scales", "_v", "metric", "ranks", "run", "steps")

    def __init__(self, run: str, metric: str, ranks: list[int], v: np.ndarray) -> None:
        self.run, self.metric, self.ranks = run, metric, ranks
        self.steps: list[int] = []
        self._v = v  # steps x ranks, of which rows ``_at`` are these steps
        self._at: list[int] = []
        self._rows: list[tuple[float, ...]] = []  # step_stats() of each step
        self._scales: list[float] = []

    def __len__(self) -> int:
        return len(self.steps)

    def _add(self, step: int, row: tuple[float, ...], at: int, sc: float) -> None:
        self.steps.append(step)
        self._rows.append(row)
        self._at.append(at)
        self._scales.append(sc)

    def stats(self) -> list[StepStats]:
        run, metric, n = self.run, self.metric, len(self.ranks)
        return [
            new_stats(run, metric, step, n, *row)
            for step, row in zip(self.steps, self._rows, strict=True)
        ]

    def _scores(self, i: int) -> RankScores:
        values, med, sc = self._v[self._at[i]].tolist(), self._rows[i][0], self._scales[i]
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
) -> list[StepResult | QuietSteps]:
    """The detector's ``update`` of each step of one (run, metric) = ``key``, with runs of quiet
    steps as one ``QuietSteps`` each: the same verdicts and state. ``v[i]``: the values of
    ``ranks`` (the same ranks in the same order at every step, at least MIN_BATCH_RANKS, all in
    the list-scoring range, ``st.grow`` done) at ``steps[i]``; ``one_by_one(i)`` scores step
    ``i`` with ``update``."""
    ok_v = np.isfinite(v)
    finite = ok_v.all(axis=1).tolist()
    stats_rows = zip(*block_stats(v if all(finite) else np.where(ok_v, v, 0.0)), strict=True)
    allowance = cfg.z_allowance
    may_be_quiet = allowance <= cfg.z_threshold
    # ``scale`` and ``learn_spread`` of a step of 3+ ranks, inlined with the state in locals
    # (the same arithmetic in the same order): two calls per quiet step were ~8 % of the
    # ingest thread with batched frames. The state goes back to ``st`` before any step is
    # scored one by one, and is read again after it.
    rule = st.rule
    rel_floor, abs_floor = rule.rel_floor or 0.0, rule.abs_floor or cfg.abs_floor
    pool, alpha = cfg.spread_pool, cfg.spread_alpha
    spread, spread_steps, last = st.spread, st.spread_steps, st.last_step
    quiet_ok = may_be_quiet and st.calm and not st.active
    out: list[StepResult | QuietSteps] = []
    quiet: QuietSteps | None = None
    for i, (step, ok, row) in enumerate(zip(steps, finite, stats_rows, strict=True)):
        if ok and quiet_ok and (last is None or step > last):
            med, mad, lo, hi = row[0], row[1], row[3], row[4]
            absmed = abs(med)
            typical = spread if spread is not None else 0.0
            sc = max(MAD_TO_SIGMA * mad, absmed * max(rel_floor, pool * typical), abs_floor)
            if sc > 0 and (hi - med) / sc < allowance and (med - lo) / sc < allowance:
                last = step
                if med != 0:
                    measured = MAD_TO_SIGMA * mad / absmed
                    spread = measured if spread is None else spread + alpha * (measured - spread)
                    spread_steps += 1
                if quiet is None:
                    quiet = QuietSteps(key[0], key[1], ranks, v)
                    out.append(quiet)
                quiet._add(step, row, i, sc)
                continue
        quiet = None
        st.spread, st.spread_steps, st.last_step = spread, spread_steps, last
        out.append(one_by_one(i))
        spread, spread_steps, last = st.spread, st.spread_steps, st.last_step
        quiet_ok = may_be_quiet and st.calm and not st.active
    st.spread, st.spread_steps, st.last_step = spread, spread_steps, last
    return out


def _filler(values: list[float], med: float, sc: float) -> Callable[[], tuple[list, list]]:
    def fill() -> tuple[list[float], list[float]]:
        return [(x - med) / sc for x in values], rel_list(values, med)

    return fill
