"""Divergence settings: per-metric rules and the calibrated defaults (see docs/divergence.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from rankwatch.aggregator.divergence import ztail
from rankwatch.aggregator.divergence.budget import small_world_limit, window_alpha
from rankwatch.aggregator.metrics import KNOWN_METRICS, KnownMetric

DIRECTIONS = ("both", "high", "low", "off")


@dataclass(frozen=True)
class MetricRule:
    """How one metric is scored; ``None`` fields take the config's default."""

    direction: str = "both"  # both | high | low | off
    high_ratio: float | None = None
    low_ratio: float | None = None
    rel_floor: float | None = None
    pair_ratio: float | None = None
    abs_floor: float | None = None  # scale floor in the metric's own unit
    offset_steps: int | None = None  # window of the persistent-offset test (offset.py); None: off

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r} is not one of {DIRECTIONS}")
        if self.offset_steps is not None and (
            type(self.offset_steps) is not int or self.offset_steps < 2
        ):
            raise ValueError(f"offset_steps must be an integer >= 2, got {self.offset_steps!r}")


def _known_rule(m: KnownMetric) -> MetricRule:
    return MetricRule(
        m.direction, m.high_ratio, m.low_ratio, m.rel_floor, m.pair_ratio, m.abs_floor,
        m.offset_steps,
    )  # fmt: skip


# The known metrics' rules (aggregator/metrics.py), where they differ from the defaults.
DEFAULT_RULES: dict[str, MetricRule] = {
    m.name: _known_rule(m) for m in KNOWN_METRICS if _known_rule(m) != MetricRule()
}


@dataclass(frozen=True)
class DivergenceConfig:
    """Calibrated defaults: see docs/divergence.md for how and their margins."""

    z_threshold: float = 3.0  # |z| marking a per-step outlier (RankScore.outlier, display)
    z_allowance: float = 1.5  # CUSUM reference: steps with |z| below this remove evidence
    evidence_limit: float = 4.5  # CUSUM limit: flag when the evidence reaches this ...
    evidence_ranks: int = 8  # ... for worlds up to this many ranks; beyond, it grows by ...
    evidence_per_doubling: float = 0.30  # ... this per doubling of the ranks (limit_for)
    confirm_steps: int = 2  # fewest consecutive steps that can confirm (caps one step's evidence)
    small_n: int = 8  # below this many ranks the median and MAD are shaky: ...
    small_confirm_steps: int = 3  # ... so confirmation takes at least this many steps
    clear_steps: int = 5  # consecutive clean steps that resolve a flag
    high_ratio: float = 1.05  # a rank must also be >= 5 % above the median ...
    low_ratio: float = 0.95  # ... or >= 5 % below it (effect-size gate)
    rel_floor: float = 0.01  # scale >= 1 % of |median|: identical ranks give finite z
    abs_floor: float = 1e-12  # scale floor for metrics whose median is 0
    spread_pool: float = 1.0  # scale >= this x c(n) x the recent typical relative spread
    spread_alpha: float = 0.1  # EWMA weight of one step in the typical spread
    history_alpha: float = 0.5  # EWMA weight of one step in a rank's own level (pairs)
    pair_ratio: float = 1.5  # two ranks: one must be >= 1.5x the other (or <= 1/1.5)
    pair_warmup_steps: int = 5  # clean steps a pair needs before it is scored
    blame_factor: float = 2.0  # a pair names a rank when it moved this much more than the other
    window_steps: int = 5  # the window-sum test beside the CUSUM: its window (0: off) ...
    window_allowance: float = 0.5  # ... each step adds min(max(z - this, 0), limit / 2) ...
    alarms_per_hour: float = 0.1  # the false-alarm budget per run-hour on clean data ...
    budget_steps_per_hour: float = 3600.0  # ... at this step rate ...
    budget_metrics: int = 5  # ... with this many metrics scored; the window test's limit
    # spends what the CUSUM's limits leave of it (budget.py) ...
    budget_spread: float = 0.1  # ... and small worlds' limits hold it on metrics whose ranks
    # spread by up to this share of their median (ztail.py: the wider, the heavier z's tail)
    lag_steps: int = 20  # step_lag: a rank this many steps behind the median is a straggler
    lag_mad_factor: float = 5.0  # ... or more, when ranks log asynchronously (x 1.4826 MAD)
    rules: Mapping[str, MetricRule] = field(default_factory=lambda: dict(DEFAULT_RULES))

    def __post_init__(self) -> None:
        checks = {
            "z_threshold": self.z_threshold > 0,
            "z_allowance": self.z_allowance >= 0,
            "evidence_limit": self.evidence_limit > 0,
            "evidence_ranks": self.evidence_ranks >= 2,
            "evidence_per_doubling": self.evidence_per_doubling >= 0,
            "confirm_steps": self.confirm_steps >= 1,
            "small_n": self.small_n >= 2,
            "small_confirm_steps": self.small_confirm_steps >= 1,
            "clear_steps": self.clear_steps >= 1,
            "high_ratio": self.high_ratio >= 1,
            "low_ratio": 0 <= self.low_ratio <= 1,
            "rel_floor": self.rel_floor >= 0,
            "abs_floor": self.abs_floor > 0,
            "spread_pool": self.spread_pool >= 0,
            "spread_alpha": 0 < self.spread_alpha <= 1,
            "history_alpha": 0 < self.history_alpha <= 1,
            "pair_ratio": self.pair_ratio >= 1,
            "pair_warmup_steps": self.pair_warmup_steps >= 1,
            "blame_factor": self.blame_factor >= 1,
            "window_steps": self.window_steps == 0 or self.window_steps >= 2,
            "window_allowance": self.window_allowance >= 0,
            "alarms_per_hour": self.alarms_per_hour > 0,
            "budget_steps_per_hour": self.budget_steps_per_hour > 0,
            "budget_metrics": self.budget_metrics >= 1,
            "budget_spread": 0 <= self.budget_spread < 1,
            "lag_steps": self.lag_steps >= 1,
            "lag_mad_factor": self.lag_mad_factor >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(
                    f"divergence setting {name}={getattr(self, name)!r} is out of range"
                )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DivergenceConfig:
        """Build from a parsed TOML table; ``rules`` maps metric -> {direction, high_ratio, ...}."""
        known = {f.name: str(f.type) for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise ValueError(f"unknown divergence setting {key!r}; known: {sorted(known)}")
            if key == "rules":
                kwargs[key] = {**DEFAULT_RULES, **_parse_rules(value)}
                continue
            want = "an integer" if known[key] == "int" else "a number"
            if type(value) not in ((int,) if known[key] == "int" else (int, float)):
                raise ValueError(f"divergence setting {key!r} must be {want}, got {value!r}")
            kwargs[key] = value
        return cls(**kwargs)

    def grown_limit(self, n: int) -> float:
        """The CUSUM limit the budget counts at ``n`` ranks, on z ~ N(0, 1).

        Every rank is a chance of a false flag, so a world twice as big would raise twice as
        many false alarms at one limit. +0.25 per doubling would halve a rank's rate and hold
        the run's where it is at 8 ranks (the CUSUM's run length grows ~4x per +0.5); the
        default grows faster, so the CUSUM spends less of the budget in bigger worlds and the
        window test, which confirms a shift of a few sigma sooner, gets the rest
        (budget.py, docs/divergence.md)."""
        if n <= self.evidence_ranks or not self.evidence_per_doubling:
            return self.evidence_limit
        return self.evidence_limit + self.evidence_per_doubling * math.log2(n / self.evidence_ranks)

    def limit_for(self, n: int) -> float:
        """The CUSUM limit for a step scored across ``n`` ranks: ``grown_limit``, raised in a
        small world (``ztail.applies``, from ``small_n`` ranks) until the CUSUM, on the law of
        that world's z, flags a rank no more often than the normal model says it does at
        ``grown_limit`` (the z of a few ranks has a heavier tail: budget.small_world_limit,
        docs/divergence.md). Below ``small_n`` a flag takes three steps and the limits stay
        the grown ones: there the law's rate did not match what was measured."""
        limit = self._limits.get(n)
        if limit is None:
            limit = self._limits[n] = self._limit(n)
        return limit

    def _limit(self, n: int) -> float:
        grown = self.grown_limit(n)
        if n < self.small_n or not ztail.applies(n):
            return grown
        error = ztail.scale_error(self.spread_alpha, n)
        return small_world_limit(
            grown, self.z_allowance, self.confirm_steps, self.confirm_steps, n,
            self.spread_pool, self.budget_spread, error,
        )  # fmt: skip

    @cached_property
    def _limits(self) -> dict[int, float]:
        # the limits by world size, derived once per config (limit_for is on the scoring path)
        return {}

    @property
    def quiet_below(self) -> float:
        """A step whose every |z| is below this adds nothing to any test (CUSUM or window)."""
        if not self.window_steps:
            return self.z_allowance
        return min(self.z_allowance, self.window_allowance)

    def window_alpha(self, n: int) -> float:
        """The window test's false-flag probability per rank, step and direction in a world of
        ``n`` ranks: the budget the CUSUM's limits leave (``budget.window_alarms_per_hour``)
        spread over every rank, metric and step of an hour, and the two directions."""
        return window_alpha(self, n)

    def rule(self, metric: str) -> MetricRule:
        """The rule for ``metric``, matching ``train/loss`` or ``train.loss`` by ``loss`` too."""
        rule = self.rules.get(metric)
        if rule is None:
            base = metric.replace(".", "/").rsplit("/", 1)[-1]
            rule = self.rules.get(base, MetricRule())
        return MetricRule(
            rule.direction,
            self.high_ratio if rule.high_ratio is None else rule.high_ratio,
            self.low_ratio if rule.low_ratio is None else rule.low_ratio,
            self.rel_floor if rule.rel_floor is None else rule.rel_floor,
            self.pair_ratio if rule.pair_ratio is None else rule.pair_ratio,
            self.abs_floor if rule.abs_floor is None else max(rule.abs_floor, self.abs_floor),
            rule.offset_steps,
        )


def _parse_rules(raw: Any) -> dict[str, MetricRule]:
    if not isinstance(raw, Mapping):
        raise ValueError("divergence setting 'rules' must be a table of metric -> rule")
    out = {}
    allowed = {f.name for f in fields(MetricRule)}
    for metric, spec in raw.items():
        if isinstance(spec, str):
            spec = {"direction": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(f"divergence rule for {metric!r} must be a table or a direction")
        bad = set(spec) - allowed
        if bad:
            raise ValueError(f"unknown key {sorted(bad)[0]!r} in divergence rule for {metric!r}")
        out[str(metric)] = MetricRule(**spec)
    return out
