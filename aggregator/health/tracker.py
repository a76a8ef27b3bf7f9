"""Rank health from the records each rank sends: alive, stalled, lost, paused, finished, crashed.

Pure: ``now`` is the aggregator's clock, passed in. Every record counts as a sign of life; step
records (and the ``last_step`` of heartbeats) count as progress. A rank is

* ``lost`` when nothing arrived for ``max(lost_after_s, 2 * next_in + LOST_MARGIN_S)``, where
  ``next_in`` is what its last heartbeat announced (a rank announcing a long checkpoint is given
  that long);
* ``stalled`` when it is heard from but its step has not advanced for
  ``max(min_stall_s, stall_factor * typical step interval)``;
* ``paused`` during an announced pause (event ``pause`` or a heartbeat with ``paused``), until the
  announced end (then the rules above apply again);
* ``finished`` after an ``end`` event, ``crashed`` after a ``crash`` event, until the same process
  sends a newer record or a new process of that rank starts.

Silence and stalls are measured up to ``heard`` (``HealthTracker.heard``), the time up to which
the aggregator has taken in every frame that reached it, when that is earlier than ``now``: a
rank is silent only if what was received since holds nothing from it, so while the aggregator
itself is behind or was stopped nobody turns lost or stalled for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rankwatch.agent.wire.records import (
    EventRecord,
    Heartbeat,
    RanksBlock,
    Record,
    StepRecord,
)
from rankwatch.aggregator.health.rules import (
    DEFAULT_LOST_AFTER_S,
    DEFAULT_MIN_STALL_S,
    DEFAULT_STALL_FACTOR,
    HEALTH_FIELDS,
    RankFacts,
    RankHealth,
    RankState,
    advance,
    clear_terminal,
    end_pause,
    reopens,
    state_of,
    step_reopens,
    usual_alive,
)
from rankwatch.aggregator.health.table import RankTable

Health = dict[str, RankTable]  # run -> its ranks' health: a snapshot


class HealthChanges(list[tuple[RankHealth, str]]):
    """What ``HealthTracker.changes`` returns: (health, old state) per changed rank, and the
    ranks, states and runs that its loop holds anyway, as columns. A consumer of a burst of
    thousands (the incident tracker) reads these lists instead of one attribute of each value
    per field. The columns describe the items as ``changes`` made them (``in_step``); a slice or
    a copy is a plain list."""

    __slots__ = ("ranks", "runs", "states")

    def __init__(self) -> None:
        super().__init__()
        self.ranks: list[int] = []
        self.states: list[RankState] = []
        self.runs: list[str] = []  # the runs of the items, each once, in their order

    def in_step(self) -> bool:
        """Whether the columns still describe the items (nobody appended to it since)."""
        return len(self.ranks) == len(self) == len(self.states)


class HealthTracker:
    def __init__(
        self,
        lost_after_s: float = DEFAULT_LOST_AFTER_S,
        stall_factor: float = DEFAULT_STALL_FACTOR,
        min_stall_s: float = DEFAULT_MIN_STALL_S,
    ) -> None:
        for name, value in (
            ("lost_after_s", lost_after_s),
            ("stall_factor", stall_factor),
            ("min_stall_s", min_stall_s),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.lost_after_s = lost_after_s
        self.stall_factor = stall_factor
        self.min_stall_s = min_stall_s
        self._ranks: dict[str, dict[int, RankFacts]] = {}
        # Bumped by every record that may change a state by itself (a new rank, an event, a
        # paused heartbeat, any record of a rank not alive); between bumps only the passing
        # of time changes states.
        self.version = 0
        self._dirty: set[tuple[str, int]] = set()  # the ranks of those records (``refresh``)
        self._heard: float | None = None  # None: everything up to ``now`` is taken in

    def heard(self, until: float) -> None:
        """Every record that reached the aggregator before ``until`` has been observed."""
        if self._heard is None or until > self._heard:
            self._heard = until

    def observe(self, rec: Record, now: float) -> None:
        ranks = self._ranks.setdefault(rec.run, {})
        r = ranks.get(rec.rank)
        if r is None:  # alive from this record on, and evaluated at the next ``refresh``
            r = ranks[rec.rank] = RankFacts(now)
            self.version += 1
            self._dirty.add((rec.run, rec.rank))
            was_alive = True
        elif r.terminal is not None and not reopens(r, rec):
            return  # a straggling record from before the end/crash: it changes nothing
        else:
            was_alive = self._state(r, now)[0] is RankState.ALIVE
            if (
                not was_alive
                or type(rec) is EventRecord
                or (isinstance(rec, Heartbeat) and rec.paused is not None)
            ):
                self.version += 1  # maybe a state change (not just the passing of time)
                self._dirty.add((rec.run, rec.rank))
        r.last_seen = now
        if isinstance(rec, StepRecord):
            r.host, r.pid, r.world_size = rec.host, rec.pid, rec.world_size
            advance(r, rec.step, rec.time, now, rec.metrics.get("step_time"))
            clear_terminal(r)
            end_pause(r, now)
        elif isinstance(rec, Heartbeat):
            self._heartbeat(r, rec, now)
        elif isinstance(rec, EventRecord):
            r.host, r.pid, r.world_size = rec.host, rec.pid, rec.world_size
            self._event(r, rec, now)
        if not was_alive and r.terminal is None:
            r.since = now  # if it is alive now, it has been since this record

    def observe_ranks(self, block: RanksBlock, rows: Sequence[int] | None, now: float) -> None:
        """``observe`` of the records ``rows`` of ``block`` (None: all), each as its
        StepRecord, in one call: the usual rank (alive, not paused), which is all of them but
        a few, asks ``usual_alive`` rather than ``state_of`` for its words."""
        run = block.run
        ranks = self._ranks.setdefault(run, {})
        step_time = block.metrics.get("step_time")
        cols: list[Sequence[Any]] = [
            block.ranks, block.seq, block.pids, block.hosts, block.step, block.time
        ]  # fmt: skip
        if step_time is not None:
            cols.append(step_time)
        if rows is not None:  # often one row (a rank's step held until its next record)
            cols = [[col[i] for i in rows] for col in cols]
        if step_time is None:  # a first step logs none: as long as the rows, not the block
            cols.append([None] * len(cols[0]))
        world_size, alive, dirty = block.world_size, RankState.ALIVE, self._dirty
        judged = self._judged(now)
        lost_s, min_stall, factor = self.lost_after_s, self.min_stall_s, self.stall_factor
        for rank, seq, pid, host, step, rank_time, logged in zip(*cols, strict=True):
            r = ranks.get(rank)
            if r is None:
                r = ranks[rank] = RankFacts(now)
                self.version += 1
                dirty.add((run, rank))
            if r.terminal is None and r.paused_until is None:
                was_alive = usual_alive(r, judged, lost_s, min_stall, factor)
            elif r.terminal is not None and not step_reopens(r, seq, pid):
                continue
            else:
                was_alive = self._state(r, now)[0] is alive
            if not was_alive:
                self.version += 1
                dirty.add((run, rank))
            r.last_seen = now
            r.host, r.pid, r.world_size = host, pid, world_size
            advance(r, step, rank_time, now, logged)
            if r.terminal is not None:
                clear_terminal(r)
            if r.paused_until is not None:
                end_pause(r, now)
            if not was_alive and r.terminal is None:
                r.since = now

    def snapshot(self, now: float, run: str | None = None) -> Health:
        """Every rank's health, per run (only ``run``'s when given)."""
        if run is None:
            self._dirty.clear()  # every rank is evaluated: ``refresh`` starts from this
        runs = self._ranks.items() if run is None else [(run, self._ranks.get(run))]
        return {
            name: RankTable(
                [(rank, self._health(name, rank, r, now)) for rank, r in sorted(ranks.items())]
            )
            for name, ranks in runs
            if ranks is not None
        }

    def refresh(
        self,
        prev: Mapping[str, Mapping[int, RankHealth]],
        now: float,
        also: Iterable[tuple[str, int]] = (),
    ) -> tuple[Health, set[tuple[str, int]]]:
        """``prev`` (an earlier whole ``snapshot``) with the ranks whose records may have
        changed their state since, and the (run, rank) of ``also``, evaluated again at
        ``now``, and those (run, rank); the other ranks as they were then. A new mapping:
        ``prev`` is left as it is, and shares with it what did not change (``RankTable``), so
        that a new rank or a crash costs a few ranks' evaluation at 100,000 ranks, not a copy
        of every rank's. A run's table is in rank order, new ranks in their place."""
        dirty, self._dirty = self._dirty, set()
        dirty.update(also)
        out = {run: RankTable.of(ranks) for run, ranks in prev.items() if run in self._ranks}
        by_run: dict[str, list[int]] = {}
        for run, rank in dirty:
            by_run.setdefault(run, []).append(rank)
        health = self._health
        for run, ranks in by_run.items():
            known = self._ranks.get(run)
            if known is None:
                continue
            fresh = [
                (rank, health(run, rank, r, now))
                for rank in sorted(ranks)
                if (r := known.get(rank)) is not None
            ]
            table = out.get(run)
            out[run] = table.replaced(fresh) if table is not None else RankTable(fresh)
        return out, dirty

    def keys(self) -> list[tuple[str, int]]:
        """(run, rank) of every rank, in snapshot order."""
        return [(run, rank) for run, ranks in self._ranks.items() for rank in sorted(ranks)]

    def count(self) -> int:
        return sum(len(ranks) for ranks in self._ranks.values())

    def health_of(self, run: str, ranks: Iterable[int], now: float) -> dict[int, RankHealth]:
        """The health of some ranks of ``run`` now (those it knows), in rank order: what a
        summary of a big run lists, without evaluating every rank."""
        known = self._ranks.get(run, {})
        return {
            rank: self._health(run, rank, known[rank], now)
            for rank in sorted(ranks)
            if rank in known
        }

    def changes(
        self,
        now: float,
        snapshot: Mapping[str, Mapping[int, RankHealth]] | None = None,
        only: set[tuple[str, int]] | None = None,
    ) -> HealthChanges:
        """(health, old state) for every rank whose state changed since the last call.

        A rank seen for the first time is reported with old state ``""``. ``snapshot``: this
        ``now``'s ``snapshot()``, if the caller has it (evaluating thousands of ranks is not free).
        ``only``: the (run, rank) that can have changed (``refresh``'s), when the caller knows.
        """
        out = HealthChanges()
        # the items' rank and state are in hand here: kept as columns at an append each
        item, rank_of, state_of, runs = out.append, out.ranks.append, out.states.append, out.runs
        if only is not None:
            for run, rank in sorted(only):
                r = self._ranks.get(run, {}).get(rank)
                if r is None:
                    continue
                health = (snapshot or {}).get(run, {}).get(rank) or self._health(run, rank, r, now)
                state = health.state
                if state != r.state:
                    item((health, r.state.value if r.state is not None else ""))
                    rank_of(rank)
                    state_of(state)
                    if not runs or runs[-1] != run:
                        runs.append(run)
                    r.state = state
            return out
        for run, ranks in self._ranks.items():
            known = snapshot.get(run, {}) if snapshot is not None else {}
            before = len(out)
            for rank, r in ranks.items():
                health = known.get(rank) or self._health(run, rank, r, now)
                state = health.state
                if state != r.state:
                    old = r.state.value if r.state is not None else ""
                    r.state = state
                    item((health, old))
                    rank_of(rank)
                    state_of(state)
            if len(out) > before:
                runs.append(run)
        return out

    def forget(self, run: str) -> None:
        if self._ranks.pop(run, None) is not None:
            self.version += 1  # a snapshot taken before still lists the run

    # --- internals -------------------------------------------------------------------------

    def _heartbeat(self, r: RankFacts, hb: Heartbeat, now: float) -> None:
        r.dropped = max(r.dropped, hb.dropped)
        r.next_in = hb.next_in if hb.next_in > 0 and math.isfinite(hb.next_in) else None
        if hb.last_step is not None and (r.last_step is None or hb.last_step > r.last_step):
            # Steps sent but not (yet) received still show the rank is moving.
            r.last_step = hb.last_step
            r.last_progress = now
            r.prev_step_time = None  # unknown rank time: do not learn an interval from it
        if hb.paused is not None:
            if r.paused_until is None:
                r.since = now
            r.paused_until = now + (r.next_in or 0.0)
            r.pause_reason = hb.paused
        else:  # the agent's heartbeat says whether it is paused right now
            end_pause(r, now)

    def _event(self, r: RankFacts, ev: EventRecord, now: float) -> None:
        kind = ev.event
        if kind == "start":  # a new process: forget the old one's progress
            clear_terminal(r)
            r.message = ""
            r.last_step = r.prev_step_time = r.paused_until = None
            r.last_progress = now
        elif kind == "end":
            r.terminal, r.end_seq, r.since = RankState.FINISHED, ev.seq, now
            r.message = f"finished ({ev.info.get('reason', 'normal')})"
        elif kind == "crash":
            r.terminal, r.end_seq, r.since = RankState.CRASHED, ev.seq, now
            exc = ev.info.get("exc_type") or "crash"
            text = str(ev.info.get("message") or "").strip()
            r.message = f"crashed: {exc}: {text}" if text else f"crashed: {exc}"
            r.message += f" at step {ev.step}" if ev.step is not None else ""
        elif kind == "pause":
            seconds = ev.info.get("seconds")
            if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0:
                r.paused_until = now + float(seconds)
            else:
                r.paused_until = now + self.lost_after_s
            r.pause_reason = str(ev.info.get("reason") or "pause")
            r.since = now
        elif kind == "resume":
            end_pause(r, now)
        if ev.step is not None and (r.last_step is None or ev.step > r.last_step):
            r.last_step = ev.step
            r.last_progress = now

    def _health(self, run: str, rank: int, r: RankFacts, now: float) -> RankHealth:
        state, message, since = self._state(r, now)
        # RankHealth(...) without the frozen __init__'s 15 object.__setattr__ calls: every
        # rank is evaluated every tick (4,096 ranks: half the cost).
        health = object.__new__(RankHealth)
        health.__dict__.update(zip(HEALTH_FIELDS, (
            run, rank, state, r.host, r.pid, r.world_size, r.last_step, r.last_seen,
            r.first_seen, message, r.dropped, r.step_time, since, r.paused_until, r.last_progress,
        ), strict=True))  # fmt: skip
        return health

    def _state(self, r: RankFacts, now: float) -> tuple[RankState, str, float]:
        judged = self._judged(now)
        return state_of(r, now, judged, self.lost_after_s, self.min_stall_s, self.stall_factor)

    def _judged(self, now: float) -> float:
        """Silence and stalls are judged up to what the aggregator has taken in."""
        return now if self._heard is None else min(now, self._heard)
