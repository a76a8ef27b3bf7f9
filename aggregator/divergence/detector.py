"""Cross-rank divergence: which rank's metric has left the others, since when, by how much.

Pure. Worlds whose ranks are all below ``PY_MAX_RANKS`` are scored on plain lists: numpy's
fixed cost per call (some 50 calls a step) would dwarf, at 8 ranks, what the arithmetic takes
(docs/benchmarks.md). Larger worlds are scored with numpy, where that cost is small beside the
work. Both paths compute the same floats in the same order (``divergence_lists.py``
follows numpy's percentile and summation exactly), so a verdict never depends on the path.
The method, its defaults and their calibration are in docs/divergence.md; in short:

* Per step: median, MAD and percentiles across the ranks with a finite value; per rank a robust
  z-score ``(x - median) / scale`` and a ratio ``rel`` (``x / median`` for a positive median).
  ``scale`` is ``1.4826 * MAD`` floored by ``rel_floor * |median|``, by ``abs_floor`` and by half
  the run's recent typical spread, so a step where the healthy ranks happen to agree closely does
  not blow up the z of the fourth.
* Confirmation: a one-sided CUSUM per rank and direction on the z-score (allowance
  ``z_allowance``, limit ``evidence_limit``, raised in worlds of more than ``evidence_ranks``
  ranks by ``DivergenceConfig.limit_for`` so a bigger world raises no more false alarms), each
  step adding at most limit / ``confirm_steps``, so a single spike never flags, a large jump is
  confirmed in ``confirm_steps`` steps and a 3-sigma shift in about four (five at 1,024 ranks).
  The rank must also be past the ratio gate (``high_ratio`` / ``low_ratio``) on the confirming
  step. It resolves after ``clear_steps`` consecutive steps without evidence.
* Non-finite values (NaN, ±Inf) are flagged at once.
* Two ranks: the median of two says nothing about which is bad. The pair is scored against its
  own typical spread, and the blame goes to the rank that moved from its own recent level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
from rankwatch.aggregator.divergence.lists import PAIRWISE_BLOCK, step_stats
from rankwatch.aggregator.divergence.lists import no_outliers as _no_outliers
from rankwatch.aggregator.divergence.lists import rel_list as _rel_lists
from rankwatch.aggregator.divergence.state import (
    MAD_TO_SIGMA,
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
    RankScore,
    RankScores,
    StepResult,
    StepStats,
    new_result,
    new_stats,
)
from rankwatch.aggregator.merge import StepGrid, StepValues

MAX_RANK = 1 << 20  # ranks at or above this are ignored (state arrays are indexed by rank)
PERCENTILES = (5.0, 25.0, 50.0, 75.0, 95.0)
# Worlds whose ranks are all below this are scored on lists, faster than numpy there
# (bench/divergence_cost.py, docs/benchmarks.md). Lists follow
# numpy's summation only up to PAIRWISE_BLOCK values, hence the cap.
PY_MAX_RANKS = PAIRWISE_BLOCK

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

_NONE: frozenset[int] = frozenset()


class DivergenceDetector:
    """Feed it every StepValues from the merger; it keeps the state of every (run, metric)."""

    def __init__(self, config: DivergenceConfig | None = None) -> None:
        self.config = config or DivergenceConfig()
        self._states: dict[tuple[str, str], MetricState] = {}
        self.ignored_ranks = 0  # values from ranks outside 0..MAX_RANK-1

    def active(self, run: str | None = None) -> list[Divergence]:
        return [
            d
            for (r, _), st in self._states.items()
            if run is None or r == run
            for d in st.active.values()
        ]

    def forget(self, run: str) -> None:
        for key in [k for k in self._states if k[0] == run]:
            del self._states[key]

    def update(self, sv: StepValues) -> StepResult:
        key = (sv.run, sv.metric)
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = MetricState(self.config.rule(sv.metric))
        values = sv.values
        if st.lists:
            if not values:
                return self._update_lists(st, sv, -1)
            top = max(values)
            if top < PY_MAX_RANKS and min(values) >= 0:
                return self._update_lists(st, sv, top)
        return self._update_arrays(st, sv)

    def update_many(self, groups: Sequence[StepValues | StepGrid]) -> list[StepResult | QuietSteps]:
        """``update`` of each StepValues (a StepGrid: of each of its ``step_values()``): the
        same verdicts, the same state after. Results come per (run, metric) in the order given,
        (run, metric)s in order of first appearance.

        Consecutive steps of one (run, metric) with the same ranks in the same order, in a
        small world, are scored together (``divergence_batch``): their statistics in a few
        numpy calls, only the steps that are not quiet one by one, and each run of quiet steps
        comes as one ``QuietSteps`` (``QuietSteps.results()`` gives its StepResults)."""
        if len(groups) < MIN_BATCH_STEPS and all(type(g) is StepValues for g in groups):
            return [self.update(sv) for sv in groups]  # type: ignore[arg-type]
        by_key: dict[tuple[str, str], list[StepValues | tuple[StepGrid, int, _GridStats]]] = {}
        for g in groups:
            if type(g) is StepGrid:
                grid = _GridStats(_grid_array(g))  # steps x ranks x metrics
                for j, metric in enumerate(g.names):
                    by_key.setdefault((g.run, metric), []).append((g, j, grid))
                continue
            same = by_key.get((g.run, g.metric))  # type: ignore[union-attr]
            if same is None:
                same = by_key[(g.run, g.metric)] = []  # type: ignore[union-attr]
            same.append(g)  # type: ignore[arg-type]
        out: list[StepResult | QuietSteps] = []
        for key, same in by_key.items():
            start = 0
            while start < len(same):
                first = same[start]
                if type(first) is tuple:
                    out += self._update_grid(key, *first)
                    start += 1
                    continue
                ranks = list(first.values)
                end = start + 1
                while end < len(same) and type(same[end]) is StepValues:
                    if list(same[end].values) != ranks:  # type: ignore[union-attr]
                        break
                    end += 1
                out += self._update_values(key, same[start:end], ranks)  # type: ignore[arg-type]
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
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = MetricState(self.config.rule(key[1]))
        if not st.lists:
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

        def one(i: int) -> StepResult:
            values = dict(zip(grid.ranks, v[i].tolist(), strict=True))
            sv = StepValues(key[0], key[1], grid.steps[i], values, grid.world_size, grid.complete)
            return self.update(sv)

        st = self._batch_state(key, grid.ranks, len(grid.steps))
        if st is None:
            return [one(i) for i in range(len(grid.steps))]
        return score_run(self.config, st, key, grid.ranks, grid.steps, v, one, values.stats(j))

    # --- small worlds: lists --------------------------------------------------------------

    def _update_lists(self, st: MetricState, sv: StepValues, top: int) -> StepResult:
        cfg, rule, step = self.config, st.rule, sv.step
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
        if n:
            stats = new_stats(sv.run, sv.metric, step, n, *step_stats(fin_values))
        else:
            stats = _no_stats(sv)
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
                and (stats.max - med) / sc < cfg.z_allowance  # max(z), exactly: z rises with x
                and (med - stats.min) / sc < cfg.z_allowance
                and cfg.z_allowance <= cfg.z_threshold
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
                    (hi_ok and zi >= zt and ri >= hi_ratio)
                    or (lo_ok and zi <= -zt and ri <= lo_ratio)
                    for zi, ri in zip(z, rel, strict=True)
                ]
            if in_order and n >= 2:
                quiet = z_hi < cfg.z_allowance and -z_lo < cfg.z_allowance
                self._evidence_lists(
                    st, sv, stats, fin_ranks, fin_values, z, rel, quiet, new, resolved
                )
        if n >= 2 and in_order:
            learn_spread(cfg, st, stats, fin_ranks, fin_values)
        if bad:  # the non-finite ranks back in, in the StepValues' order
            scored = iter(zip(z, rel, outlier, strict=True))
            nan_row = (math.nan, math.nan, False)
            rows = [next(scored) if math.isfinite(x) else nan_row for x in values]
            z, rel, outlier = ([row[c] for row in rows] for c in range(3))
        flagged = frozenset(r for (r, _) in st.active) if st.active else _NONE
        return StepResult(stats, RankScores(ranks, values, z, rel, outlier, flagged), new, resolved)

    def _evidence_lists(
        self,
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
        """``_evidence_arrays`` one rank at a time (same operations, same order).

        ``quiet``: every |z| is below the allowance, so every rank's step evidence is negative.
        """
        cfg, rule, step, n = self.config, st.rule, sv.step, stats.n
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
        sides = []
        hit = False  # a rank reached the limit (resolving below only lowers evidence)
        for direction in ("high", "low"):
            if rule.direction not in ("both", direction):
                continue
            if direction == "high":
                ev, start, signed = st.ev_hi, st.start_hi, z
                gate = [ri >= hi_ratio for ri in rel]
            else:
                ev, start, signed = st.ev_lo, st.start_lo, [-zi for zi in z]
                gate = [ri <= lo_ratio for ri in rel]
            for r, s, ok in zip(ranks, signed, gate, strict=True):
                s -= allowance
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
                if before == 0 and after > 0:
                    start[r] = step
                if ok and after >= limit:
                    hit = True
            sides.append((direction, ev, gate))
        if st.active:
            check_active(cfg, st, step, {r: i for i, r in enumerate(ranks)}, z, rel, n, resolved)
        st.calm = not (any(st.ev_hi) or any(st.ev_lo))
        if not hit:
            return
        active = st.active
        fresh = [
            (i, direction)
            for direction, ev, gate in sides
            for i, r in enumerate(ranks)
            if gate[i] and ev[r] >= limit and (r, "outlier") not in active
        ]
        if fresh:
            new_outliers(cfg, st, sv, stats, fresh, ranks, v, z, rel, new)

    # --- large worlds: numpy --------------------------------------------------------------

    def _update_arrays(self, st: MetricState, sv: StepValues) -> StepResult:
        cfg = self.config
        st.to_arrays()
        count = len(sv.values)
        ranks = np.fromiter(sv.values.keys(), np.int64, count)
        values = np.fromiter(sv.values.values(), np.float64, count)
        if count and (ranks.min() < 0 or ranks.max() >= MAX_RANK):
            keep = (ranks >= 0) & (ranks < MAX_RANK)
            self.ignored_ranks += int(count - keep.sum())
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

        z, rel = self._score_arrays(st, stats, fin_values)
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
                self._evidence_arrays(st, sv, stats, fin_ranks, fin_values, z, rel, new, resolved)
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
        return StepResult(stats, scores, new, resolved)

    def _score_arrays(
        self, st: MetricState, stats: StepStats, v: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        if stats.n == 0:
            return v.copy(), v.copy()
        med = stats.median
        absmed = abs(med)
        z = (v - med) / scale(self.config, st, stats)
        if stats.n == 2:
            rel = np.array(_rel_lists(v.tolist(), med))
        elif absmed > 0:
            rel = 1.0 + (v - med) / absmed
        else:
            rel = np.where(v == 0, 1.0, np.copysign(np.inf, v))
        return z, rel

    def _evidence_arrays(
        self,
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
        cfg, rule, step = self.config, st.rule, sv.step
        if stats.n == 2 and st.spread_steps < cfg.pair_warmup_steps:
            return  # a pair has no yardstick yet
        limit, allowance = cfg.limit_for(stats.n), cfg.z_allowance
        cap = limit / (cfg.confirm_steps if stats.n >= cfg.small_n else cfg.small_confirm_steps)
        hi_ratio, lo_ratio = gates(rule, stats.n)
        sides = []
        for direction, ev, start, signed, gate in (
            ("high", st.ev_hi, st.start_hi, z, rel >= hi_ratio),
            ("low", st.ev_lo, st.start_lo, -z, rel <= lo_ratio),
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
            sides.append((direction, ev, gate))
        if st.active:
            pos = np.full(st.size, -1, np.int64)
            pos[ranks] = np.arange(ranks.size)
            at = {k[0]: int(pos[k[0]]) for k in st.active if k[1] == "outlier"}
            at = {r: i for r, i in at.items() if i >= 0}
            check_active(cfg, st, step, at, z, rel, stats.n, resolved)
        fresh = [
            (i, direction)
            for direction, ev, gate in sides
            for i in np.flatnonzero((ev[ranks] >= limit) & gate).tolist()
            if (int(ranks[i]), "outlier") not in st.active
        ]
        if fresh:
            if stats.n == 2:
                ranks, v = ranks.tolist(), v.tolist()
            new_outliers(cfg, st, sv, stats, fresh, ranks, v, z, rel, new)


def _no_stats(sv: StepValues) -> StepStats:
    nan = math.nan
    return StepStats(sv.run, sv.metric, sv.step, 0, nan, nan, nan, nan, nan, nan, nan, nan, nan)


def _stats(sv: StepValues, v: np.ndarray) -> StepStats:
    n = int(v.size)
    if n == 0:
        return _no_stats(sv)
    p5, p25, med, p75, p95 = (float(x) for x in np.percentile(v, PERCENTILES))
    mad = float(np.median(np.abs(v - med)))
    return StepStats(
        sv.run, sv.metric, sv.step, n, med, mad, float(v.mean()), float(v.min()), float(v.max()),
        p5, p25, p75, p95,
    )  # fmt: skip


def expand(items: Sequence[StepResult | QuietSteps]) -> list[StepResult]:
    """``update_many``'s results with each QuietSteps as its StepResults."""
    return [r for it in items for r in (it.results() if type(it) is QuietSteps else (it,))]


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
