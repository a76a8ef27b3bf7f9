"""The one step at whose end every rank stops (or checkpoints): pure.

In synchronous training every rank must leave after the same step, or the ones still in the
loop wait in a collective for a rank that left. The aggregator names that step: the highest
step any rank reported, plus the steps the ranks have made since that report (its age, at the
usual step time: a busy head node reads records late) and enough more that the command
reaches every rank before any of them gets there (``STOP_LEAD_S``), at least
``MIN_MARGIN_STEPS``. A rank that gets it late (already past the step) acts at its next step
end and says ``late``: in lockstep training that is a hang risk, so the margin errs long.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

MIN_MARGIN_STEPS = 2  # steps ahead of the highest reported step, at least
MAX_MARGIN_STEPS = 1000  # ... and at most (a step time near 0 must not mean "never")
STOP_LEAD_S = 0.1  # time a command sent in the tick has to reach every rank: a flush, a hop
# (one asked for between ticks waits for the next tick too); a late rank costs a move, not a hang
UNKNOWN_PACE_STEPS = 10  # the margin while the run's step time is not known
MAX_BEHIND_S = 30.0  # a report older than this (or a clock far off) counts as this old


def stop_step(
    last_steps: Iterable[int | None],
    step_time_s: float | None,
    *,
    min_margin: int = MIN_MARGIN_STEPS,
    lead_s: float = STOP_LEAD_S,
    behind_s: float = 0.0,
) -> int:
    """The step every rank acts at: ``max(last_steps) + margin`` (0 when none reported).
    ``behind_s``: how long ago the highest step was made (the rank's record time)."""
    highest = max((s for s in last_steps if s is not None), default=0)
    margin = max(min_margin, UNKNOWN_PACE_STEPS)  # no step time yet: err long
    if step_time_s is not None and step_time_s > 0 and math.isfinite(step_time_s):
        behind = min(MAX_BEHIND_S, behind_s) if behind_s > 0 else 0.0
        ahead = math.ceil((lead_s + behind) / step_time_s)
        margin = max(min_margin, min(MAX_MARGIN_STEPS, ahead))
    return max(0, highest) + margin


def typical_step_time(step_times: Iterable[float | None]) -> float | None:
    """The median of the ranks' step times (None when no rank has one)."""
    values = sorted(t for t in step_times if t is not None and t > 0 and math.isfinite(t))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
