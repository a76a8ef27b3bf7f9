"""Cross-rank divergence: which rank's metric has left the others, since when, by how much.

Pure. The detector keeps the state of every (run, metric) and picks how a step is scored:
worlds whose ranks are all below ``PY_MAX_RANKS`` one step at a time on plain lists
(``small``), larger ones with numpy (``large``), and runs of consecutive steps together
(``update_many``, ``batch``). Every path computes the same floats in the same order, so a
verdict never depends on the path.
The method, its defaults and their calibration are in docs/divergence.md; in short:

* Per step: median, MAD and percentiles across the ranks with a finite value; per rank a robust
  z-score ``(x - median) / scale`` and a ratio ``rel`` (``x / median`` for a positive median).
  ``scale`` is ``1.4826 * MAD`` floored by ``rel_floor * |median|``, by ``abs_floor`` and by the
  pooled scale (the run's recent typical spread times a small-sample factor, ``robust``), so the
  MAD of a few ranks is not the only yardstick.
* Confirmation: a one-sided CUSUM per rank and direction on the z-score (allowance
  ``z_allowance``, limit ``evidence_limit``, raised in worlds of more than ``evidence_ranks``
  ranks by ``DivergenceConfig.limit_for`` so a bigger world raises no more false alarms), each
  step adding at most limit / ``confirm_steps``, so a single spike never flags, a large jump is
  confirmed in ``confirm_steps`` steps and a 3-sigma shift in about four (five at 1,024 ranks).
  The rank must also be past the ratio gate (``high_ratio`` / ``low_ratio``) on the confirming
  step. It resolves after ``clear_steps`` consecutive steps without evidence.
* Beside the CUSUM, from ``small_n`` ranks up, a window sum (``window``): a rank is also flagged
  when its last ``window_steps`` z-scores, less ``window_allowance`` and capped, add up to a
  limit derived from the false-alarm budget; it brings a 3-sigma shift within 5 steps to about
  0.96 of what a test that knew the onset could do.
* Non-finite values (NaN, ±Inf) are flagged at once.
* Persistent offsets (``offset``, for metrics whose rule sets ``offset_steps``): a rank's mean
  log ratio to the other ranks over a window, for a shift too small for the CUSUM that lasts.
* Two ranks: the median of two says nothing about which is bad. The pair is scored against its
  own typical spread, and the blame goes to the rank that moved from its own recent level.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain

import numpy as np
from rankwatch.aggregator.divergence.batch import (
    MIN_BATCH_RANKS,
    MIN_BATCH_STEPS,
    QuietSteps,
    finite_columns,
    score_run,
)
from rankwatch.aggregator.divergence.config import DivergenceConfig, MetricRule
from rankwatch.aggregator.divergence.large import score_arrays
from rankwatch.aggregator.divergence.listing import KIND_ORDER, ActiveList, list_active
from rankwatch.aggregator.divergence.offset import OffsetState
from rankwatch.aggregator.divergence.offset import observe as observe_offset
from rankwatch.aggregator.divergence.small import PY_MAX_RANKS, score_lists
from rankwatch.aggregator.divergence.state import (
    MAD_TO_SIGMA,
    MetricState,
)
from rankwatch.aggregator.divergence.types import (
    Divergence,
    RankScore,
    RankScores,
    StepResult,
    StepStats,
)
from rankwatch.aggregator.merge import StepGrid, StepValues

__all__ = [
    "MAD_TO_SIGMA",
    "Divergence",
    "DivergenceConfig",
    "DivergenceDetector",
    "MetricRule",
    "QuietSteps",
    "RankScore",
    "RankScores",
    "StepResult",
    "StepStats",
    "expand",
    "step_lag",
]


class DivergenceDetector:
    """Feed it every StepValues from the merger; it keeps the state of every (run, metric)."""

    def __init__(self, config: DivergenceConfig | None = None) -> None:
        self.config = config or DivergenceConfig()
        self._states: dict[tuple[str, str], MetricState] = {}
        # run -> metric -> its state (the same objects): a run's reads do not walk every run's
        self._by_run: dict[str, dict[str, MetricState]] = {}
        self._offsets: dict[tuple[str, str], OffsetState] = {}
        self.ignored_ranks = 0  # values from ranks outside 0..MAX_RANK-1
        # run -> (its flags' versions, its listing): made again when a flag changed
        self._listings: dict[str, tuple[tuple[int, ...], ActiveList]] = {}

    def active(self, run: str | None = None) -> list[Divergence]:
        states = self._states.values() if run is None else self._by_run.get(run, {}).values()
        return [d for st in states for d in st.active.values()]

    def listing(self, run: str) -> ActiveList:
        """``run``'s active divergences as a summary gives them (``listing.list_active``),
        kept until one of its flags is set or cleared."""
        flags = [st.active for st in self._by_run.get(run, {}).values()]
        key = tuple(f.version for f in flags)
        kept = self._listings.get(run)
        if kept is not None and kept[0] == key:
            return kept[1]
        made = list_active(d for f in flags for d in f.values())
        self._listings[run] = (key, made)
        return made

    def flagged_on(self, run: str, ranks: Iterable[int]) -> dict[int, set[str]]:
        """rank -> the metrics it is flagged on, for those of ``ranks`` flagged on any: what a
        listed rank's entry says (a look-up per rank, metric and kind, not a pass over every
        active divergence)."""
        out: dict[int, set[str]] = {}
        flags = [(m, st.active) for m, st in self._by_run.get(run, {}).items() if st.active]
        if not flags:
            return out
        for rank in ranks:
            for metric, active in flags:
                if any((rank, kind) in active for kind in KIND_ORDER):
                    out.setdefault(rank, set()).add(metric)
        return out

    def forget(self, run: str) -> None:
        self._listings.pop(run, None)
        for metric in self._by_run.pop(run, {}):
            del self._states[(run, metric)]
            self._offsets.pop((run, metric), None)

    def _state(self, key: tuple[str, str]) -> MetricState:
        """The state of (run, metric), made at its first step."""
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = MetricState(self.config.rule(key[1]))
            self._by_run.setdefault(key[0], {})[key[1]] = st
        return st

    def update(self, sv: StepValues) -> StepResult:
        key = (sv.run, sv.metric)
        st = self._state(key)
        values = sv.values
        if st.lists and (not values or (max(values) < PY_MAX_RANKS and min(values) >= 0)):
            result = score_lists(self.config, st, sv, max(values) if values else -1)
        else:
            result, ignored = score_arrays(self.config, st, sv)
            self.ignored_ranks += ignored
        if st.rule.offset_steps is not None:
            ost = self._offsets.get(key)
            if ost is None:
                ost = self._offsets[key] = OffsetState(st.rule.offset_steps)
            observe_offset(self.config, st, ost, sv, result.stats, result.new, result.resolved)
        return result

    def update_array(
        self, run: str, metric: str, step: int, ranks: np.ndarray, values: np.ndarray,
        world_size: int, complete: bool = True,
    ) -> StepResult:  # fmt: skip
        """``update`` of the step whose rank ``ranks[i]`` reported ``values[i]`` (int64 and
        float64 arrays, ranks distinct): the same verdicts and state; a large world's step is
        scored from the arrays as they are."""
        key = (run, metric)
        st = self._state(key)
        large = not st.lists or (ranks.size > 0 and int(ranks.max()) >= PY_MAX_RANKS)
        if not large or st.rule.offset_steps is not None:
            values_of = dict(zip(ranks.tolist(), values.tolist(), strict=True))
            return self.update(StepValues(run, metric, step, values_of, world_size, complete))
        sv = StepValues(run, metric, step, {}, world_size, complete)
        result, ignored = score_arrays(self.config, st, sv, (ranks, values))
        self.ignored_ranks += ignored
        return result

    def update_many(self, groups: Sequence[StepValues | StepGrid]) -> list[StepResult | QuietSteps]:
        """``update`` of each StepValues (a StepGrid: of each of its ``step_values()``): the
        same verdicts, the same state after. Results come per (run, metric) in the order given,
        (run, metric)s in order of first appearance.

        Consecutive steps of one (run, metric) with the same ranks in the same order, in a
        small world, are scored together (``divergence_batch``): their statistics in a few
        numpy calls, only the steps that are not quiet one by one, and each run of quiet steps
        comes as one ``QuietSteps`` (``QuietSteps.results()`` gives its StepResults)."""
        if len(groups) < MIN_BATCH_STEPS:
            svs = [g for g in groups if isinstance(g, StepValues)]
            if len(svs) == len(groups):
                return [self.update(sv) for sv in svs]
        by_key: dict[tuple[str, str], list[StepValues | tuple[StepGrid, int, _GridStats]]] = {}
        for g in groups:
            if isinstance(g, StepGrid):
                grid = _GridStats(_grid_array(g))  # steps x ranks x metrics
                for j, metric in enumerate(g.names):
                    by_key.setdefault((g.run, metric), []).append((g, j, grid))
                continue
            same = by_key.get((g.run, g.metric))
            if same is None:
                same = by_key[(g.run, g.metric)] = []
            same.append(g)
        out: list[StepResult | QuietSteps] = []
        for key, same in by_key.items():
            start = 0
            while start < len(same):
                first = same[start]
                if isinstance(first, tuple):
                    out += self._update_grid(key, *first)
                    start += 1
                    continue
                ranks = list(first.values)
                batch = [first]  # and the StepValues after it with the same ranks in that order
                end = start + 1
                while end < len(same):
                    nxt = same[end]
                    if not isinstance(nxt, StepValues) or list(nxt.values) != ranks:
                        break
                    batch.append(nxt)
                    end += 1
                out += self._update_values(key, batch, ranks)
                start = end
        return out

    def _batch_state(
        self, key: tuple[str, str], ranks: list[int], steps: int
    ) -> MetricState | None:
        """The state to score these steps column-wise with, or None: one by one."""
        if steps < MIN_BATCH_STEPS or len(ranks) < MIN_BATCH_RANKS:
            return None
        if min(ranks) < 0 or max(ranks) >= PY_MAX_RANKS:
            return None
        st = self._state(key)
        if not st.lists or st.rule.offset_steps is not None:  # the offset test reads every step
            return None
        st.grow(max(ranks), PY_MAX_RANKS)
        return st

    def _update_values(
        self, key: tuple[str, str], svs: list[StepValues], ranks: list[int]
    ) -> list[StepResult] | list[StepResult | QuietSteps]:
        st = self._batch_state(key, ranks, len(svs))
        if st is None:
            return [self.update(sv) for sv in svs]
        v = np.array([list(sv.values.values()) for sv in svs], dtype=np.float64)
        steps = [sv.step for sv in svs]
        return score_run(self.config, st, key, ranks, steps, v, lambda i: self.update(svs[i]))

    def _update_grid(
        self, key: tuple[str, str], grid: StepGrid, j: int, values: _GridStats
    ) -> list[StepResult] | list[StepResult | QuietSteps]:
        v = values.v[:, :, j]

        ranks = np.array(grid.ranks, np.int64)

        def one(i: int) -> StepResult:
            return self.update_array(
                key[0], key[1], grid.steps[i], ranks, v[i], grid.world_size, grid.complete
            )

        st = self._batch_state(key, grid.ranks, len(grid.steps))
        if st is None:
            return [one(i) for i in range(len(grid.steps))]
        return score_run(self.config, st, key, grid.ranks, grid.steps, v, one, values.stats(j))


def expand(items: Sequence[StepResult | QuietSteps]) -> list[StepResult]:
    """``update_many``'s results with each QuietSteps as its StepResults."""
    return [r for it in items for r in (it.results() if isinstance(it, QuietSteps) else (it,))]


def step_lag(run: str, last_steps: Mapping[int, int], config: DivergenceConfig) -> list[Divergence]:
    """Ranks whose last step lags the median of the ranks' last steps by too much."""
    if len(last_steps) < 2:
        return []
    ranks = np.fromiter(last_steps.keys(), np.int64, len(last_steps))
    steps = np.fromiter(last_steps.values(), np.float64, len(last_steps))
    med = float(np.median(steps))
    spread = MAD_TO_SIGMA * float(np.median(np.abs(steps - med)))
    allowed = max(float(config.lag_steps), config.lag_mad_factor * spread)
    out = []
    for i in np.flatnonzero(med - steps > allowed).tolist():
        rank, last = int(ranks[i]), int(steps[i])
        lag = med - last
        message = (
            f"rank {rank} is at step {last}, {lag:.0f} steps behind the median step "
            f"{med:.0f} of {len(last_steps)} ranks"
        )
        rel = last / med if med > 0 else math.nan
        z = -lag / max(spread, 1.0)
        d = Divergence(
            run, "step", rank, "straggler", "low", last, int(med), float(last), med, z, rel,
            message, len(last_steps),
        )  # fmt: skip
        out.append(d)
    return out


class _GridStats:
    """A grid's values (steps x ranks x metrics) and, once a metric asks, the statistics of
    every metric's steps, computed together (``finite_columns``)."""

    __slots__ = ("_stats", "v")

    def __init__(self, v: np.ndarray) -> None:
        self.v = v
        self._stats: tuple[np.ndarray, list[np.ndarray]] | None = None

    def stats(self, j: int) -> tuple[np.ndarray, list[np.ndarray]]:
        if self._stats is None:
            self._stats = finite_columns(self.v)
        finite, cols = self._stats
        return finite[:, j], [c[:, j] for c in cols]


def _grid_array(grid: StepGrid) -> np.ndarray:
    """``np.array(grid.rows, np.float64)``, faster: the values (floats, as decoded)
    flattened in one C pass, the shape known from the grid."""
    shape = (len(grid.rows), len(grid.ranks), len(grid.names))
    flat = chain.from_iterable(chain.from_iterable(grid.rows))
    return np.fromiter(flat, np.float64, shape[0] * shape[1] * shape[2]).reshape(shape)
