"""The metrics rankwatch knows by name: which way a rank's value is a fault, the unit, and
where the dashboard and `rankwatch status` show them. The one table; the divergence rules
(``divergence.config.DEFAULT_RULES``), the chart order (``dashboard.views``) and the status
table's columns (``alerts.console``) are derived from it. Any other metric is scored both ways
with the defaults and shown after these, by name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownMetric:
    name: str
    direction: str  # both | high | low | off: which way from the other ranks is a fault
    unit: str  # "" for a pure number
    order: int | None  # place on the dashboard and in `rankwatch status`; None: with the rest
    # Divergence settings of this metric beyond the defaults (None: DivergenceConfig's).
    high_ratio: float | None = None
    low_ratio: float | None = None
    rel_floor: float | None = None
    pair_ratio: float | None = None
    abs_floor: float | None = None  # in the metric's own unit
    nonnegative: bool = False  # a value below 0 is impossible: the chart's axis starts at 0
    # Also test each rank's mean log ratio to the other ranks over this many steps, for a small
    # offset that lasts (divergence/offset.py); None: off.
    offset_steps: int | None = None


KNOWN_METRICS: tuple[KnownMetric, ...] = (
    KnownMetric("loss", "both", "", 0, nonnegative=True),
    # Every rank follows the same schedule, so any difference is a bug: exact match, 0.01 %.
    KnownMetric("lr", "both", "", 1, 1.0001, 0.9999, 1e-6, 1.0001, nonnegative=True),
    # A fast rank is not a problem, a slow one is.
    KnownMetric("throughput", "low", "samples/s", 2, nonnegative=True),
    KnownMetric("step_time", "high", "s", 3, nonnegative=True),
    KnownMetric("grad_norm", "both", "", 4, nonnegative=True),
    # This rank's gradient norm before the all-reduce: a card computing slightly wrong
    # gradients (silent data corruption) shows here only, as a small offset that lasts.
    KnownMetric("grad_norm_local", "both", "", None, nonnegative=True, offset_steps=16),
    # Dynamic; its changes are not a rank fault.
    KnownMetric("loss_scale", "off", "", 5, nonnegative=True),
    # Host time outside the step (data loading): a slow loader shows here and nowhere else in
    # synchronous data parallelism, where every rank waits for the slowest in the all-reduce.
    # Millisecond jitter is normal, so the scale never drops below 10 ms.
    KnownMetric(
        "data_time",
        "high",
        "s",
        None,
        high_ratio=2.0,
        rel_floor=0.25,
        abs_floor=0.01,
        nonnegative=True,
    ),
)

BY_NAME: dict[str, KnownMetric] = {m.name: m for m in KNOWN_METRICS}


def display_order() -> tuple[str, ...]:
    """The known metrics that have a place, in it."""
    placed = [m for m in KNOWN_METRICS if m.order is not None]
    return tuple(m.name for m in sorted(placed, key=lambda m: m.order or 0))


def metric_info(name: str) -> dict[str, str | bool]:
    """What the page needs to label a metric's chart: its unit ("" for none or unknown) and
    whether its axis may go below 0 (an unknown metric may)."""
    known = BY_NAME.get(name)
    if known is None:
        return {"unit": "", "nonnegative": False}
    return {"unit": known.unit, "nonnegative": known.nonnegative}
