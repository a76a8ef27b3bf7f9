"""The tick's view of rank health: one snapshot shared by the tick, the alerts, the commands and
every reader, kept fresh at a cost that does not grow with the ranks on every tick.

* every rank is evaluated again (a sweep) every ``HEALTH_EVERY_S``, or every ``SWEEP_DUTY``
  times the last sweep took if that is longer: only time moves states between records (lost,
  stalled), and at 100,000 ranks a sweep takes a second or more. Beyond ``ROLLING_RANKS``
  ranks the sweep rolls: each call evaluates the share of the ranks due since the last one, so
  no single hold of the service's lock evaluates every rank;
* after a record that may change a state by itself (a new rank, an event, a record of a rank
  not alive: ``HealthTracker.version``), only that record's rank is evaluated again
  (``HealthTracker.refresh``: the new snapshot shares the other ranks' entries with the last,
  ``RankTable``);
* ``changes`` looks for state changes once per snapshot, in the ranks that snapshot evaluated.

The clock is the caller's, and so is the timer of the sweep's duration (``perf_counter`` by
default): a test gives one that does not depend on how loaded the machine is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from rankwatch.aggregator.health import Health, HealthTracker, RankHealth
from rankwatch.aggregator.settings import HEALTH_EVERY_S

# A sweep every HEALTH_EVERY_S, unless a sweep takes more than 1/SWEEP_DUTY of that: then less
# often, so sweeps take at most that share of the ingest thread.
SWEEP_DUTY = 10.0
ROLLING_RANKS = 4096  # beyond this many ranks in all, a sweep is spread over the ticks
ROLL_MAX_SHARE = 0.2  # of the ranks in one call, however long since the last (a stall)


class HealthView:
    def __init__(
        self, tracker: HealthTracker, timer: Callable[[], float] = time.perf_counter
    ) -> None:
        self.tracker = tracker
        self.timer = timer
        self._cached: tuple[int, float, Health] | None = None  # (version, sweep time, snapshot)
        self.sweep_every_s = HEALTH_EVERY_S
        self.sweeps = 0
        self.last_sweep_s = 0.0  # how long the last sweep took
        # the snapshot ``changes`` last looked in, and the ranks evaluated since (None: every
        # rank was)
        self._checked: Health | None = None
        self._unchecked: set[tuple[str, int]] | None = None
        self._swept = False  # a sweep since the last ``take_swept``
        # the ranks evaluated since the last ``take_evaluated`` (None: every rank)
        self._evaluated: set[tuple[str, int]] | None = None
        # the rolling sweep: its order of ranks, how far it got, when, and its cost so far
        self._order: list[tuple[str, int]] = []
        self._cursor = 0
        self._rolled = 0.0
        self._cost = 0.0

    def snapshot(self, now: float) -> Health:
        """Every rank's health as of ``now`` (a sweep's ranks as of that sweep)."""
        cached = self._cached
        if cached is not None and now >= cached[1] and self.tracker.count() > ROLLING_RANKS:
            return self._roll(cached, now)
        version = self.tracker.version
        if cached is None or not 0 <= now - cached[1] < self.sweep_every_s:
            t0 = self.timer()
            self._cached = cached = (version, now, self.tracker.snapshot(now))
            self._sweep_done(self.timer() - t0)
            self._unchecked = self._evaluated = None
            self._order, self._cursor, self._rolled = [], 0, now
        elif cached[0] != version:
            fresh, touched = self.tracker.refresh(cached[2], now)
            self._cached = cached = (version, cached[1], fresh)
            self._touched(touched)
        return cached[2]

    def _roll(self, cached: tuple[int, float, Health], now: float) -> Health:
        """The next share of the rolling sweep, and the ranks whose records may have changed
        their state."""
        if self._cursor >= len(self._order):  # a whole sweep done: the next one begins
            if self._order:
                self._sweep_done(self._cost)
            self._order, self._cursor, self._cost = self.tracker.keys(), 0, 0.0
        share = min(ROLL_MAX_SHARE, max(0.0, now - self._rolled) / self.sweep_every_s)
        due = math.ceil(len(self._order) * share)
        if due == 0 and cached[0] == self.tracker.version:
            return cached[2]
        t0 = self.timer()
        keys = self._order[self._cursor : self._cursor + due]
        fresh, touched = self.tracker.refresh(cached[2], now, keys)
        self._cost += self.timer() - t0
        self._cursor += len(keys)
        self._rolled = now
        self._cached = (self.tracker.version, cached[1], fresh)
        self._touched(touched)
        return fresh

    def _touched(self, ranks: set[tuple[str, int]]) -> None:
        if self._unchecked is not None:
            self._unchecked |= ranks
        if self._evaluated is not None:
            self._evaluated |= ranks

    def _sweep_done(self, took_s: float) -> None:
        self.last_sweep_s = took_s
        self.sweep_every_s = max(HEALTH_EVERY_S, SWEEP_DUTY * took_s)
        self.sweeps += 1
        self._swept = True

    def changes(self, now: float, health: Health) -> list[tuple[RankHealth, str]]:
        """``HealthTracker.changes`` once per new snapshot, in the ranks it evaluated."""
        if health is self._checked:
            return []
        changed = self.tracker.changes(now, health, self._unchecked)
        self._checked, self._unchecked = health, set()
        return changed

    def take_evaluated(self) -> set[tuple[str, int]] | None:
        """The ranks evaluated again since the last call (None: every rank was)."""
        evaluated, self._evaluated = self._evaluated, set()
        return evaluated

    def take_swept(self) -> bool:
        """Whether a sweep happened since the last call."""
        swept, self._swept = self._swept, False
        return swept
