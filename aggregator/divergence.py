"""Cross-rank divergence: which rank's metric has left the others, since when, by how much.

Pure and vectorised with numpy (one call per (run, metric, step), 4,096 ranks in well under a
millisecond). The method, its defaults and their calibration are in docs/divergence.md; in short:

* Per step: median, MAD and percentiles across the ranks with a finite value; per rank a robust
  z-score ``(x - median) / scale`` and a ratio ``rel`` (``x / median`` for a positive median).
  ``scale`` is ``1.4826 * MAD`` floored by ``rel_floor * |median|``, by ``abs_floor`` and by half
  the run's recent typical spread, so a step where the healthy ranks happen to agree closely does
  not blow up the z of the fourth.
* Confirmation: a one-sided CUSUM per rank and direction on the z-score (allowance
  ``z_allowance``, limit ``evidence_limit``), each step adding at most ``evidence_limit /
  confirm_steps``, so a single spike never flags, a large jump is confirmed in ``confirm_steps``
  steps and a 3-sigma shift in about four. The rank must also be past the ratio gate
  (``high_ratio`` / ``low_ratio``) on the confirming step. It resolves after ``clear_steps``
  consecutive steps without evidence.
* Non-finite values (NaN, ±Inf) are flagged at once.
* Two ranks: the median of two says nothing about which is bad. The pair is scored against its
  own typical spread, and the blame goes to the rank that moved from its own recent level.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np
from rankwatch.aggregator.divergence_config import DivergenceConfig, MetricRule
from rankwatch.aggregator.merge import StepValues

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
MAX_RANK = 1 << 20  # ranks at or above this are ignored (state arrays are indexed by rank)
PERCENTILES = (5.0, 25.0, 50.0, 75.0, 95.0)

__all__ = [
    "Divergence",
    "DivergenceConfig",
    "DivergenceDetector",
    "MetricRule",
    "RankScore",
    "StepResult",
    "StepStats",
    "step_lag",
]


@dataclass(frozen=True)
class StepStats:
    run: str
    metric: str
    step: int
    n: int  # ranks with a finite value
    median: float
    mad: float
    mean: float
    min: float
    max: float
    p5: float
    p25: float
    p75: float
    p95: float


@dataclass(frozen=True)
class RankScore:
    rank: int
    value: float
    z: float
    rel: float  # x / median for a positive median; 1 + (x - median) / |median| in general
    outlier: bool  # this step alone: |z| >= z_threshold and past the ratio gate
    nonfinite: bool
    flagged: bool = False  # a confirmed divergence of this rank and metric is active


@dataclass(frozen=True)
class Divergence:
    run: str
    metric: str
    rank: int
    kind: str  # outlier | nonfinite | straggler
    direction: str  # high | low
    since_step: int
    step: int  # step of this report (flagged, or resolved)
    value: float
    median: float
    z: float
    rel: float
    message: str
    n: int = 0  # ranks compared
    confident: bool = True  # False: two ranks and no way to tell which one changed


class RankScores(Mapping[int, RankScore]):
    """rank -> RankScore for one step, built on access (4,096 objects per step are not free)."""

    def __init__(
        self,
        ranks: np.ndarray,
        values: np.ndarray,
        z: np.ndarray,
        rel: np.ndarray,
        outlier: np.ndarray,
        flagged: frozenset[int],
    ) -> None:
        # The arrays are public for bulk readers (the store, the live feed), all in one order.
        # (``values`` is the Mapping method, hence ``value_array``.)
        self.ranks, self.value_array, self.z, self.rel, self.outlier = (
            ranks,
            values,
            z,
            rel,
            outlier,
        )
        self._flagged = flagged
        self._pos: dict[int, int] | None = None

    def __getitem__(self, rank: int) -> RankScore:
        if self._pos is None:
            self._pos = {r: i for i, r in enumerate(self.ranks.tolist())}
        i = self._pos[rank]
        value = float(self.value_array[i])
        return RankScore(
            rank,
            value,
            float(self.z[i]),
            float(self.rel[i]),
            bool(self.outlier[i]),
            not math.isfinite(value),
            rank in self._flagged,
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self.ranks.tolist())

    def __len__(self) -> int:
        return int(self.ranks.size)


@dataclass(frozen=True)
class StepResult:
    stats: StepStats
    scores: Mapping[int, RankScore]
    new: list[Divergence]
    resolved: list[Divergence]


class _State:
    """Per (run, metric): evidence per rank and direction, spread and own-level history."""

    def __init__(self, rule: MetricRule) -> None:
        self.rule = rule
        self.size = 0
        self.ev_hi = np.zeros(0)  # CUSUM evidence that the rank is above the others
        self.ev_lo = np.zeros(0)
        self.start_hi = np.zeros(0, np.int64)  # step where the current evidence run began
        self.start_lo = np.zeros(0, np.int64)
        self.own = np.zeros(0)  # EWMA of log|x| per rank (pairs only), NaN until seen
        self.spread: float | None = None  # EWMA of 1.4826 * MAD / |median|
        self.spread_steps = 0
        self.last_step: int | None = None
        self.active: dict[tuple[int, str], Divergence] = {}  # (rank, kind) -> divergence
        self.clean: dict[tuple[int, str], int] = {}  # consecutive clean steps while active

    def grow(self, top: int) -> None:
        if top < self.size:
            return
        size = max(top + 1, 2 * self.size, 8)
        pad = size - self.size
        self.ev_hi = np.concatenate([self.ev_hi, np.zeros(pad)])
        self.ev_lo = np.concatenate([self.ev_lo, np.zeros(pad)])
        self.start_hi = np.concatenate([self.start_hi, np.zeros(pad, np.int64)])
        self.start_lo = np.concatenate([self.start_lo, np.zeros(pad, np.int64)])
        self.own = np.concatenate([self.own, np.full(pad, np.nan)])
        self.size = size


class DivergenceDetector:
    """Feed it every StepValues from the merger; it keeps the state of every (run, metric)."""

    def __init__(self, config: DivergenceConfig | None = None) -> None:
        self.config = config or DivergenceConfig()
        self._states: dict[tuple[str, str], _State] = {}
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
        cfg = self.config
        key = (sv.run, sv.metric)
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = _State(cfg.rule(sv.metric))
        count = len(sv.values)
        ranks = np.fromiter(sv.values.keys(), np.int64, count)
        values = np.fromiter(sv.values.values(), np.float64, count)
        if count and (ranks.min() < 0 or ranks.max() >= MAX_RANK):
            keep = (ranks >= 0) & (ranks < MAX_RANK)
            self.ignored_ranks += int(count - keep.sum())
            ranks, values = ranks[keep], values[keep]
        if ranks.size:
            st.grow(int(ranks.max()))
        finite = np.isfinite(values)
        fin_ranks, fin_values = ranks[finite], values[finite]
        stats = _stats(sv, fin_values)
        in_order = st.last_step is None or sv.step > st.last_step
        if in_order:
            st.last_step = sv.step
        new: list[Divergence] = []
        resolved: list[Divergence] = []
        self._nonfinite(st, sv, stats, ranks, values, finite, in_order, new, resolved)

        z, rel = self._score(st, stats, fin_values)
        z_all = np.full(values.size, np.nan)
        rel_all = np.full(values.size, np.nan)
        z_all[finite], rel_all[finite] = z, rel
        rule = st.rule
        hi_ok = rule.direction in ("both", "high")
        lo_ok = rule.direction in ("both", "low")
        outlier = np.zeros(values.size, bool)
        if hi_ok or lo_ok:
            zt = cfg.z_threshold
            hi_ratio, lo_ratio = _gates(rule, stats.n)
            hi = (z >= zt) & (rel >= hi_ratio) if hi_ok else False
            lo = (z <= -zt) & (rel <= lo_ratio) if lo_ok else False
            outlier[finite] = hi | lo
            if in_order and stats.n >= 2:
                self._evidence(st, sv, stats, fin_ranks, fin_values, z, rel, new, resolved)
        if stats.n >= 2 and in_order:
            self._learn_spread(st, stats, fin_ranks, fin_values)
        flagged = frozenset(r for (r, _) in st.active)
        scores = RankScores(ranks, values, z_all, rel_all, outlier, flagged)
        return StepResult(stats, scores, new, resolved)

    # --- per-step pieces ------------------------------------------------------------------

    def _score(self, st: _State, stats: StepStats, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        if stats.n == 0:
            return v.copy(), v.copy()
        med = stats.median
        absmed = abs(med)
        typical = st.spread if st.spread is not None else 0.0
        if stats.n == 2:  # the MAD of two values is their own distance: history only
            rel_scale = max(st.rule.rel_floor or 0.0, typical)
            scale = max(absmed * rel_scale, st.rule.abs_floor or cfg.abs_floor)
        else:
            rel_scale = max(st.rule.rel_floor or 0.0, cfg.spread_pool * typical)
            scale = max(
                MAD_TO_SIGMA * stats.mad, absmed * rel_scale, st.rule.abs_floor or cfg.abs_floor
            )
        z = (v - med) / scale
        if stats.n == 2:  # leave-one-out: the median of the others is the other rank
            other = v[::-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(other != 0, v / other, np.where(v == 0, 1.0, np.inf))
        elif absmed > 0:
            rel = 1.0 + (v - med) / absmed
        else:
            rel = np.where(v == 0, 1.0, np.copysign(np.inf, v))
        return z, rel

    def _learn_spread(self, st: _State, stats: StepStats, ranks: np.ndarray, v: np.ndarray) -> None:
        if stats.median == 0:
            return
        if stats.n == 2:
            # A pair learns its spread and levels only on quiet steps: a fault must not become
            # the new normal while it is being confirmed.
            if st.active or st.ev_hi[ranks].any() or st.ev_lo[ranks].any():
                return
            logs = np.log(np.abs(v), where=v != 0, out=np.full(v.size, np.nan))
            own = st.own[ranks]
            a = self.config.history_alpha
            st.own[ranks] = np.where(np.isnan(own), logs, (1 - a) * own + a * logs)
        measured = MAD_TO_SIGMA * stats.mad / abs(stats.median)
        if st.spread is None:
            st.spread = measured
        else:
            st.spread += self.config.spread_alpha * (measured - st.spread)
        st.spread_steps += 1

    def _nonfinite(
        self,
        st: _State,
        sv: StepValues,
        stats: StepStats,
        ranks: np.ndarray,
        values: np.ndarray,
        finite: np.ndarray,
        in_order: bool,
        new: list[Divergence],
        resolved: list[Divergence],
    ) -> None:
        if not finite.all():
            for i in np.flatnonzero(~finite).tolist():
                rank, value = int(ranks[i]), float(values[i])
                k = (rank, "nonfinite")
                st.clean.pop(k, None)
                if k in st.active:
                    continue
                word = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
                d = Divergence(
                    sv.run, sv.metric, rank, "nonfinite", "low" if value < 0 else "high",
                    sv.step, sv.step, value, stats.median, math.nan, math.nan,
                    f"rank {rank} {sv.metric} is {word} at step {sv.step}"
                    + (f" (median of the other ranks {stats.median:.4g})" if stats.n else ""),
                    stats.n,
                )  # fmt: skip
                st.active[k] = d
                new.append(d)
        if in_order and any(kind == "nonfinite" for _, kind in st.active):
            finite_ranks = set(ranks[finite].tolist())
            for k in [k for k in st.active if k[1] == "nonfinite" and k[0] in finite_ranks]:
                self._tick_clean(st, k, sv.step, resolved, "finite again")

    def _tick_clean(
        self, st: _State, k: tuple[int, str], step: int, resolved: list[Divergence], why: str
    ) -> None:
        count = st.clean.get(k, 0) + 1
        if count < self.config.clear_steps:
            st.clean[k] = count
            return
        st.clean.pop(k, None)
        d = st.active.pop(k)
        resolved.append(replace(d, step=step, message=f"{d.message}; {why} at step {step}"))
        if k[1] == "outlier" and k[0] < st.size:
            st.ev_hi[k[0]] = st.ev_lo[k[0]] = 0.0

    def _evidence(
        self,
        st: _State,
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
        limit, allowance = cfg.evidence_limit, cfg.z_allowance
        cap = limit / (cfg.confirm_steps if stats.n >= cfg.small_n else cfg.small_confirm_steps)
        hi_ratio, lo_ratio = _gates(rule, stats.n)
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
            self._check_active(st, step, ranks, z, rel, stats.n, resolved)
        fresh = [
            (i, direction)
            for direction, ev, gate in sides
            for i in np.flatnonzero((ev[ranks] >= limit) & gate).tolist()
            if (int(ranks[i]), "outlier") not in st.active
        ]
        if not fresh:
            return
        moved = None
        if stats.n == 2:
            fresh, moved = self._blame_pair(st, ranks, v, fresh)
        for i, direction in fresh:
            rank = int(ranks[i])
            start = st.start_hi if direction == "high" else st.start_lo
            since = int(start[rank])
            d = self._outlier(sv, stats, rank, direction, since, v, z, rel, i, ranks, moved)
            st.active[(rank, "outlier")] = d
            new.append(d)

    def _check_active(
        self,
        st: _State,
        step: int,
        ranks: np.ndarray,
        z: np.ndarray,
        rel: np.ndarray,
        n: int,
        resolved: list[Divergence],
    ) -> None:
        pos = np.full(st.size, -1, np.int64)
        pos[ranks] = np.arange(ranks.size)
        allowance = self.config.z_allowance
        hi_ratio, lo_ratio = _gates(st.rule, n)
        for k, d in list(st.active.items()):
            if k[1] != "outlier" or pos[k[0]] < 0:
                continue  # not reported this step: nothing learned
            i = pos[k[0]]
            if d.direction == "high":
                clean = z[i] < allowance or rel[i] < hi_ratio
            else:
                clean = -z[i] < allowance or rel[i] > lo_ratio
            if clean:
                self._tick_clean(st, k, step, resolved, "back with the others")
            else:
                st.clean.pop(k, None)

    def _blame_pair(
        self, st: _State, ranks: np.ndarray, v: np.ndarray, fresh: list[tuple[int, str]]
    ) -> tuple[list[tuple[int, str]], np.ndarray]:
        """Of two disagreeing ranks, keep the one that moved from its own recent level."""
        logs = np.log(np.abs(v), where=v != 0, out=np.full(2, np.inf))
        moved = np.abs(logs - st.own[ranks])
        moved = np.where(np.isnan(moved), np.inf, moved)  # no own history: unknown
        if any((int(r), "outlier") in st.active for r in ranks.tolist()):
            return [], moved  # the pair is already explained
        if len(fresh) == 2:
            i = int(np.argmax(moved))
            return [c for c in fresh if c[0] == i], moved
        i = fresh[0][0]
        other = 1 - i
        if np.isfinite(moved[other]) and moved[other] >= self.config.blame_factor * moved[i]:
            return [], moved  # the other rank changed (e.g. its throughput went up)
        return fresh, moved

    def _outlier(
        self,
        sv: StepValues,
        stats: StepStats,
        rank: int,
        direction: str,
        since: int,
        v: np.ndarray,
        z: np.ndarray,
        rel: np.ndarray,
        i: int,
        ranks: np.ndarray,
        moved: np.ndarray | None,
    ) -> Divergence:
        value, zi, ri = float(v[i]), float(z[i]), float(rel[i])
        confident = True
        if moved is not None:
            other = 1 - i
            confident = bool(
                np.isfinite(moved[other]) and moved[i] >= self.config.blame_factor * moved[other]
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


def _gates(rule: MetricRule, n: int) -> tuple[float, float]:
    if n == 2:
        pair = rule.pair_ratio or 1.0
        return pair, 1.0 / pair
    return rule.high_ratio or 1.0, rule.low_ratio or 0.0


def _ratio(r: float) -> str:
    if not math.isfinite(r):
        return "inf x"
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"


def _stats(sv: StepValues, v: np.ndarray) -> StepStats:
    n = int(v.size)
    if n == 0:
        nan = math.nan
        return StepStats(sv.run, sv.metric, sv.step, 0, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    p5, p25, med, p75, p95 = (float(x) for x in np.percentile(v, PERCENTILES))
    mad = float(np.median(np.abs(v - med)))
    return StepStats(
        sv.run, sv.metric, sv.step, n, med, mad, float(v.mean()), float(v.min()), float(v.max()),
        p5, p25, p75, p95,
    )  # fmt: skip


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
