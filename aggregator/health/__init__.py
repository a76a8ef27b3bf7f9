"""Rank health from the records each rank sends (``tracker``), by the rules of one rank
(``rules``), as tables readers share (``table``), and one word per run (``runstate``)."""

from rankwatch.aggregator.health.rules import (
    DEFAULT_LOST_AFTER_S,
    DEFAULT_MIN_STALL_S,
    DEFAULT_STALL_FACTOR,
    LOST_MARGIN_S,
    OVER_STATES,
    STEP_EWMA_ALPHA,
    RankHealth,
    RankState,
)
from rankwatch.aggregator.health.runstate import RUN_STATES, run_state, run_state_of
from rankwatch.aggregator.health.table import RankTable, Tally
from rankwatch.aggregator.health.tracker import Health, HealthChanges, HealthTracker

__all__ = [
    "DEFAULT_LOST_AFTER_S", "DEFAULT_MIN_STALL_S", "DEFAULT_STALL_FACTOR", "LOST_MARGIN_S",
    "OVER_STATES", "RUN_STATES", "STEP_EWMA_ALPHA", "Health", "HealthChanges", "HealthTracker",
    "RankHealth", "RankState", "RankTable", "Tally", "run_state", "run_state_of",
]  # fmt: skip
