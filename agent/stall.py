"""What the sender thread does about a rank that does not step: a stack sample with the next
heartbeat (``stacks.StallSampler``), and the ``faulthandler`` watchdog pushed back while steps
come (``stacks.FaultWatchdog``).

Everything here runs in the agent's background thread, at its heartbeat cadence; ``log()`` is
not touched. The usual step time is read off what ``log()`` already keeps (the step and wall
time of the last step advance): each beat that sees the step move adds the mean step time since
the beat before, and the median of the last ones is the usual step time.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
from collections import deque
from pathlib import Path
from typing import Any

from .stacks import (
    MIN_STALL_S,
    SAMPLE_INTERVAL_S,
    FaultWatchdog,
    StallSampler,
    stacks_path,
)

log = logging.getLogger("rankwatch.agent")

STACK_DUMP_ENV = "RANKWATCH_STACK_DUMP_S"
STACK_DUMP_S = 600.0  # no step for this long: every thread's stack goes to rank<k>.stacks.txt
STEP_TIMES_KEPT = 32  # step-time observations the median is taken over

_watchdog_lock = threading.Lock()
_watchdog_owner: object | None = None  # faulthandler has one timer per process


def stack_dump_s(value: float | None) -> float:
    """The watchdog's timeout from the argument or ``RANKWATCH_STACK_DUMP_S``; 0 turns it off.
    ValueError for anything but a number >= 0."""
    text: Any = value
    if value is None:
        text = os.environ.get(STACK_DUMP_ENV) or STACK_DUMP_S
    try:
        if isinstance(text, bool):
            raise ValueError
        seconds = float(text)
    except (TypeError, ValueError):
        raise ValueError(
            f"stack_dump_s ({STACK_DUMP_ENV}) must be a number of seconds >= 0 (0: off), "
            f"got {text!r}"
        ) from None
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"stack_dump_s ({STACK_DUMP_ENV}) must be >= 0 seconds, got {text!r}")
    return seconds


class StallWatch:
    """The sampler and the watchdog of one Monitor; ``beat`` is called by its sender thread."""

    def __init__(
        self,
        main_thread_id: int,
        jsonl: Path,
        *,
        period_s: float,
        dump_s: float,
        min_stall_s: float = MIN_STALL_S,
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self.sampler = StallSampler(
            main_thread_id, period_s=period_s, min_stall_s=min_stall_s, interval_s=interval_s
        )
        self.watchdog: FaultWatchdog | None = None
        self._seen: tuple[int, float] | None = None  # the (step, time) the last beat saw
        self._step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self._pause_end = -math.inf  # the last beat during a pause: a stall counts from there
        if dump_s > 0:
            self.watchdog = _arm(self, stacks_path(jsonl), dump_s)

    def beat(
        self, now: float, last: tuple[int, float] | None, paused: bool
    ) -> dict[str, Any] | None:
        """A stack sample's wire map when the rank has gone too long without a step, else
        None. ``last``: the (step, wall time) of the last step advance (None right after a
        pause or before the first step); ``paused``: an announced pause is on."""
        if last is not None and last != self._seen:
            seen = self._seen
            if seen is not None and last[0] > seen[0] and last[1] > seen[1]:
                self._step_times.append((last[1] - seen[1]) / (last[0] - seen[0]))
            self._seen = last
            self._progress()
        if paused:
            self._pause_end = now
            self._progress()  # no step is due: not stuck
            self.sampler.maybe_sample(now, None, None)  # keeps its call times true
            return None
        since = max(self._seen[1], self._pause_end) if self._seen is not None else None
        usual = statistics.median(self._step_times) if self._step_times else None
        step = self._seen[0] if self._seen is not None else None
        sample = self.sampler.maybe_sample(now, since, usual, step)
        return None if sample is None else sample.as_dict()

    def _progress(self) -> None:
        with _watchdog_lock:  # never re-armed once close() has run
            if self.watchdog is not None:
                self.watchdog.progress()

    def close(self) -> None:
        """Disarm the watchdog (first thing in ``Monitor.close``: the wait for the sender must
        not read as a stuck rank)."""
        global _watchdog_owner
        with _watchdog_lock:
            if self.watchdog is not None:
                self.watchdog.close()
                self.watchdog = None
                if _watchdog_owner is self:
                    _watchdog_owner = None


def _arm(owner: StallWatch, path: Path, dump_s: float) -> FaultWatchdog | None:
    global _watchdog_owner
    with _watchdog_lock:
        if _watchdog_owner is not None:
            log.info("rankwatch: another monitor of this process holds the stack watchdog")
            return None
        try:
            dog = FaultWatchdog(path, dump_s)
        except OSError as exc:
            log.warning("rankwatch: no stack watchdog (%s cannot be written: %s)", path, exc)
            return None
        _watchdog_owner = owner
        return dog
