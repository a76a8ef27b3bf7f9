"""Alert settings: which rules run, their severities and parameters, from the ``[alerts]``
TOML table (``AlertConfig.from_dict``: every bad key or value is a ValueError naming it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rankwatch.aggregator.telemetry.metrics import RULES as HARDWARE_RULES

SEVERITIES = ("info", "warning", "critical")
RULES = (
    "divergence", "nonfinite", "straggler", "threshold", "plateau", "throughput_drop",
    "stalled", "lost", "crashed", *HARDWARE_RULES,
)  # fmt: skip
DEFAULT_SEVERITY = {
    "divergence": "warning",
    "nonfinite": "critical",
    "straggler": "warning",
    "threshold": "warning",
    "plateau": "info",
    "throughput_drop": "warning",
    "stalled": "warning",
    "lost": "critical",
    "crashed": "critical",
    **HARDWARE_RULES,  # the hardware family (telemetry/metrics.py)
}
OPS = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}


def _check(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise ValueError(f"alert setting {where}: {message}")


@dataclass(frozen=True)
class ThresholdRule:
    metric: str
    op: str  # > >= < <=
    value: float
    on: str = "median"  # "median" of the ranks, or "any" rank (max for >, min for <)
    steps: int = 1  # consecutive steps the condition must hold before firing
    severity: str = "warning"

    def __post_init__(self) -> None:
        _check(bool(self.metric), "threshold.metric", "must not be empty")
        _check(self.op in OPS, "threshold.op", f"{self.op!r} is not one of {sorted(OPS)}")
        _check(math.isfinite(self.value), "threshold.value", f"{self.value!r} is not finite")
        _check(self.on in ("median", "any"), "threshold.on", f"{self.on!r} is not median or any")
        _check(self.steps >= 1, "threshold.steps", f"{self.steps} must be >= 1")
        _check(self.severity in SEVERITIES, "threshold.severity", f"{self.severity!r} unknown")


@dataclass(frozen=True)
class PlateauRule:
    """No improvement of a smoothed median of ``metric`` over ``steps`` steps."""

    metric: str = "loss"
    steps: int = 1_000
    min_improvement: float = 0.01  # relative: 1 % better than the best so far counts
    mode: str = "min"  # lower is better ("min") or higher ("max")
    smoothing: float = 0.1  # EWMA weight of one step: a lucky step must not set the bar

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "plateau.steps", f"{self.steps} must be >= 1")
        _check(self.min_improvement >= 0, "plateau.min_improvement", "must be >= 0")
        _check(self.mode in ("min", "max"), "plateau.mode", f"{self.mode!r} is not min or max")
        _check(0 < self.smoothing <= 1, "plateau.smoothing", "must be in (0, 1]")


@dataclass(frozen=True)
class ThroughputRule:
    """The run's median throughput below ``fraction`` of its own recent baseline."""

    metric: str = "throughput"
    fraction: float = 0.5
    baseline_steps: int = 50  # baseline = median of the run's last this-many step medians
    min_baseline_steps: int = 10
    confirm_steps: int = 3

    def __post_init__(self) -> None:
        _check(0 < self.fraction < 1, "throughput_drop.fraction", "must be in (0, 1)")
        _check(self.baseline_steps >= 1, "throughput_drop.baseline_steps", "must be >= 1")
        _check(
            1 <= self.min_baseline_steps <= self.baseline_steps,
            "throughput_drop.min_baseline_steps",
            "must be in [1, baseline_steps]",
        )
        _check(self.confirm_steps >= 1, "throughput_drop.confirm_steps", "must be >= 1")


@dataclass(frozen=True)
class AlertConfig:
    disabled: frozenset[str] = frozenset()  # rule names switched off
    severity: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_SEVERITY))
    thresholds: tuple[ThresholdRule, ...] = ()
    plateau: PlateauRule | None = PlateauRule()
    throughput_drop: ThroughputRule | None = ThroughputRule()
    group_ranks: int = 8  # more ranks than this on one rule -> one run-level alert
    history_size: int = 1_000

    def __post_init__(self) -> None:
        for name in self.disabled:
            _check(name in RULES, "disabled", f"{name!r} is not one of {RULES}")
        for name, sev in self.severity.items():
            _check(name in RULES, "severity", f"{name!r} is not one of {RULES}")
            _check(sev in SEVERITIES, f"severity.{name}", f"{sev!r} is not one of {SEVERITIES}")
        _check(self.group_ranks >= 1, "group_ranks", "must be >= 1")
        _check(self.history_size >= 1, "history_size", "must be >= 1")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AlertConfig:
        """Build from a parsed TOML ``[alerts]`` table; ValueError names the bad key."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for key, value in raw.items():
            _check(key in known, repr(key), f"unknown; known: {sorted(known)}")
            if key == "disabled":
                _check(_is_list(value, str), "disabled", "must be a list of rule names")
                kw[key] = frozenset(value)
            elif key == "severity":
                _check(isinstance(value, Mapping), "severity", "must be a table rule -> level")
                kw[key] = {**DEFAULT_SEVERITY, **value}
            elif key == "thresholds":
                _check(_is_list(value, Mapping), "thresholds", "must be a list of tables")
                kw[key] = tuple(
                    _build(ThresholdRule, f"thresholds[{i}]", t) for i, t in enumerate(value)
                )
            elif key in ("plateau", "throughput_drop"):
                rule_cls = PlateauRule if key == "plateau" else ThroughputRule
                if value is False:
                    kw[key] = None
                else:
                    _check(isinstance(value, Mapping), key, "must be a table or false")
                    kw[key] = _build(rule_cls, key, value)
            else:
                _check(type(value) is int, key, f"must be an integer, got {value!r}")
                kw[key] = value
        return cls(**kw)

    def enabled(self, rule: str) -> bool:
        return rule not in self.disabled

    def severity_of(self, rule: str) -> str:
        return self.severity.get(rule, DEFAULT_SEVERITY[rule])


def _is_list(value: Any, kind: type) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, kind) for v in value)


def _build(cls: type, where: str, raw: Mapping[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    for key, value in raw.items():
        _check(key in known, f"{where}.{key}", f"unknown; known: {sorted(known)}")
        expected = str(known[key].type)
        if expected == "int":
            ok, want = type(value) is int, "an integer"
        elif expected == "float":
            ok, want = type(value) in (int, float), "a number"
        else:
            ok, want = isinstance(value, str), "a string"
        _check(ok, f"{where}.{key}", f"must be {want}, got {value!r}")
    try:
        return cls(**raw)
    except TypeError as exc:  # a required key is missing
        raise ValueError(f"alert setting {where}: {exc}") from None
