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
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from rankwatch.agent.wire.records import EventRecord, Heartbeat, Record, StepRecord

DEFAULT_LOST_AFTER_S = 10.0
DEFAULT_STALL_FACTOR = 10.0
DEFAULT_MIN_STALL_S = 30.0
LOST_MARGIN_S = 2.0  # slack on an announced heartbeat interval (transport, batching)
STEP_EWMA_ALPHA = 0.2  # weight of the newest step interval in the typical step time

__all__ = ["HealthTracker", "RankHealth", "RankState", "run_state", "run_state_of"]


class RankState(str, Enum):
    ALIVE = "alive"
    STALLED = "stalled"
    LOST = "lost"
    FINISHED = "finished"
    CRASHED = "crashed"
    PAUSED = "paused"


@dataclass(frozen=True)
class RankHealth:
    run: str
    rank: int
    state: RankState
    host: str
    pid: int
    world_size: int
    last_step: int | None
    last_seen: float  # aggregator time of the last record
    first_seen: float
    message: str  # why the rank is in this state, for people
    dropped: int  # records the agent could not queue (from its heartbeats)
    step_time: float | None  # typical seconds per step (EWMA), None before two steps
    since: float = 0.0  # aggregator time the rank entered this state
    paused_until: float | None = None
    last_progress: float = 0.0  # aggregator time the step last advanced


_HEALTH_FIELDS = tuple(RankHealth.__dataclass_fields__)


class _Rank:
    __slots__ = (
        "dropped", "end_seq", "first_seen", "host", "last_progress", "last_seen", "last_step",
        "message", "next_in", "pause_reason", "paused_until", "pid", "prev_step_time", "since",
        "state", "step_time", "terminal", "world_size",
    )  # fmt: skip

    def __init__(self, now: float) -> None:
        self.first_seen = self.last_seen = self.last_progress = self.since = now
        self.host = ""
        self.pid = 0
        self.world_size = 0
        self.last_step: int | None = None
        self.prev_step_time: float | None = None  # rank clock at the last step advance
        self.step_time: float | None = None
        self.next_in: float | None = None
        self.dropped = 0
        self.paused_until: float | None = None
        self.pause_reason = ""
        self.terminal: RankState | None = None  # FINISHED or CRASHED
        self.end_seq = 0  # seq of the end/crash event
        self.message = ""
        self.state: RankState | None = None  # last state reported by changes()


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
        self._ranks: dict[str, dict[int, _Rank]] = {}
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
        if r is None:
            r = ranks[rec.rank] = _Rank(now)
            self.version += 1
            self._dirty.add((rec.run, rec.rank))
        if r.terminal is not None and not _reopens(r, rec):
            return  # a straggling record from before the end/crash: it changes nothing
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
            self._progress(r, rec.step, rec.time, now, rec.metrics.get("step_time"))
            _clear_terminal(r)
            _end_pause(r, now)
        elif isinstance(rec, Heartbeat):
            self._heartbeat(r, rec, now)
        elif isinstance(rec, EventRecord):
            r.host, r.pid, r.world_size = rec.host, rec.pid, rec.world_size
            self._event(r, rec, now)
        if not was_alive and r.terminal is None:
            r.since = now  # if it is alive now, it has been since this record

    def snapshot(self, now: float, run: str | None = None) -> dict[str, dict[int, RankHealth]]:
        """Every rank's health, per run (only ``run``'s when given)."""
        if run is None:
            self._dirty.clear()  # every rank is evaluated: ``refresh`` starts from this
        runs = self._ranks.items() if run is None else [(run, self._ranks.get(run))]
        return {
            name: {rank: self._health(name, rank, r, now) for rank, r in sorted(ranks.items())}
            for name, ranks in runs
            if ranks is not None
        }

    def refresh(
        self,
        prev: dict[str, dict[int, RankHealth]],
        now: float,
        also: Iterable[tuple[str, int]] = (),
    ) -> tuple[dict[str, dict[int, RankHealth]], set[tuple[str, int]]]:
        """``prev`` (an earlier whole ``snapshot``) with the ranks whose records may have
        changed their state since, and the (run, rank) of ``also``, evaluated again at
        ``now``, and those (run, rank); the other ranks as they were then. A new mapping:
        ``prev`` is left as it is. At 100,000 ranks a new rank or a crash costs a few ranks'
        evaluation, not every rank's."""
        dirty, self._dirty = self._dirty, set()
        dirty.update(also)
        out = {run: ranks for run, ranks in prev.items() if run in self._ranks}
        by_run: dict[str, list[int]] = {}
        for run, rank in dirty:
            by_run.setdefault(run, []).append(rank)
        for run, ranks in by_run.items():
            known = self._ranks.get(run)
            if known is None:
                continue
            table = dict(out.get(run, {}))
            top = next(reversed(table), -1)  # the highest rank so far (snapshots are in order)
            unordered = False
            for rank in sorted(ranks):
                r = known.get(rank)
                if r is not None:
                    unordered = unordered or (rank < top and rank not in table)
                    table[rank] = self._health(run, rank, r, now)
            out[run] = dict(sorted(table.items())) if unordered else table
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
        snapshot: dict[str, dict[int, RankHealth]] | None = None,
        only: set[tuple[str, int]] | None = None,
    ) -> list[tuple[RankHealth, str]]:
        """(health, old state) for every rank whose state changed since the last call.

        A rank seen for the first time is reported with old state ``""``. ``snapshot``: this
        ``now``'s ``snapshot()``, if the caller has it (evaluating thousands of ranks is not free).
        ``only``: the (run, rank) that can have changed (``refresh``'s), when the caller knows.
        """
        out = []
        if only is not None:
            for run, rank in sorted(only):
                r = self._ranks.get(run, {}).get(rank)
                if r is None:
                    continue
                health = (snapshot or {}).get(run, {}).get(rank) or self._health(run, rank, r, now)
                if health.state != r.state:
                    out.append((health, r.state.value if r.state is not None else ""))
                    r.state = health.state
            return out
        for run, ranks in self._ranks.items():
            known = snapshot.get(run, {}) if snapshot is not None else {}
            for rank, r in ranks.items():
                health = known.get(rank) or self._health(run, rank, r, now)
                if health.state != r.state:
                    old = r.state.value if r.state is not None else ""
                    r.state = health.state
                    out.append((health, old))
        return out

    def forget(self, run: str) -> None:
        if self._ranks.pop(run, None) is not None:
            self.version += 1  # a snapshot taken before still lists the run

    # --- internals -------------------------------------------------------------------------

    def _progress(
        self, r: _Rank, step: int, rank_time: float, now: float, logged: float | None
    ) -> None:
        if r.last_step is not None and step <= r.last_step:
            return
        if r.last_step is not None and r.prev_step_time is not None:
            # The rank's own clock measures its step interval without transport jitter.
            interval = (rank_time - r.prev_step_time) / (step - r.last_step)
            if interval > 0 and math.isfinite(interval):
                _ewma_step(r, interval)
        elif logged is not None and logged > 0 and math.isfinite(logged):
            _ewma_step(r, logged)
        r.last_step = step
        r.prev_step_time = rank_time
        r.last_progress = now

    def _heartbeat(self, r: _Rank, hb: Heartbeat, now: float) -> None:
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
            _end_pause(r, now)

    def _event(self, r: _Rank, ev: EventRecord, now: float) -> None:
        kind = ev.event
        if kind == "start":  # a new process: forget the old one's progress
            _clear_terminal(r)
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
            _end_pause(r, now)
        if ev.step is not None and (r.last_step is None or ev.step > r.last_step):
            r.last_step = ev.step
            r.last_progress = now

    def _health(self, run: str, rank: int, r: _Rank, now: float) -> RankHealth:
        state, message, since = self._state(r, now)
        # RankHealth(...) without the frozen __init__'s 15 object.__setattr__ calls: every
        # rank is evaluated every tick (4,096 ranks: half the cost).
        health = object.__new__(RankHealth)
        health.__dict__.update(zip(_HEALTH_FIELDS, (
            run, rank, state, r.host, r.pid, r.world_size, r.last_step, r.last_seen,
            r.first_seen, message, r.dropped, r.step_time, since, r.paused_until, r.last_progress,
        ), strict=True))  # fmt: skip
        return health

    def _state(self, r: _Rank, now: float) -> tuple[RankState, str, float]:
        if r.terminal is not None:
            return r.terminal, r.message, r.since
        if r.paused_until is not None and now < r.paused_until:
            left = r.paused_until - now
            return RankState.PAUSED, f"paused ({r.pause_reason}), {left:.0f} s left", r.since
        judged = now if self._heard is None else min(now, self._heard)
        silent = judged - r.last_seen
        lost_after = self.lost_after_s
        if r.next_in is not None:
            lost_after = max(lost_after, 2 * r.next_in + LOST_MARGIN_S)
        if r.paused_until is not None:  # an announced pause that overran
            lost_after = max(lost_after, r.paused_until - r.last_seen + lost_after)
        if silent > lost_after:
            return RankState.LOST, f"no record for {silent:.0f} s", r.last_seen + lost_after
        stuck = judged - max(r.last_progress, r.paused_until or 0.0)
        stall_after = self.min_stall_s
        if r.step_time is not None:
            stall_after = max(stall_after, self.stall_factor * r.step_time)
        if r.last_step is not None and stuck > stall_after:
            return (
                RankState.STALLED,
                f"step {r.last_step} has not advanced for {stuck:.0f} s",
                max(r.last_progress, r.paused_until or 0.0) + stall_after,
            )
        return RankState.ALIVE, "", r.since


def _end_pause(r: _Rank, now: float) -> None:
    if r.paused_until is not None:
        # The stall clock restarts when an announced pause ends, not at the last step before it.
        r.last_progress = max(r.last_progress, min(now, r.paused_until))
        r.paused_until = None


def _ewma_step(r: _Rank, interval: float) -> None:
    r.step_time = (
        interval
        if r.step_time is None
        else r.step_time + STEP_EWMA_ALPHA * (interval - r.step_time)
    )


def _reopens(r: _Rank, rec: Record) -> bool:
    """Does ``rec`` bring a finished/crashed rank back? Newer seq, or a new process."""
    if rec.seq > r.end_seq or (isinstance(rec, EventRecord) and rec.event == "start"):
        return True
    new_process = isinstance(rec, (StepRecord, EventRecord)) and rec.pid != r.pid
    return new_process and not (isinstance(rec, EventRecord) and rec.event in ("end", "crash"))


def _clear_terminal(r: _Rank) -> None:
    if r.terminal is not None:
        r.terminal = None
        r.message = ""
        r.end_seq = 0


# Run states, most urgent first: the first rule that matches names the run.
RUN_STATES = ("empty", "crashed", "lost", "stalled", "finished", "paused", "partial", "running")


def run_state(ranks: Iterable[RankHealth]) -> str:
    """One word for a run from its ranks' health.

    ============ =========================================================================
    ``empty``    no rank seen
    ``crashed``  any rank crashed
    ``lost``     any rank lost (silent too long)
    ``stalled``  any rank stalled
    ``finished`` every rank finished
    ``paused``   every rank paused or finished, at least one paused
    ``partial``  fewer ranks seen than the world size says (still starting, or some never came)
    ``running``  otherwise (alive ranks, possibly some already finished)
    ============ =========================================================================
    """
    ranks = list(ranks)
    if not ranks:
        return "empty"
    world = max(h.world_size for h in ranks)
    return run_state_of({h.state for h in ranks}, len(ranks), world)


def run_state_of(states: set[RankState], ranks: int, world: int) -> str:
    """``run_state`` from the set of its ranks' states, how many ranks and the world size."""
    if not ranks:
        return "empty"
    for state, word in (
        (RankState.CRASHED, "crashed"),
        (RankState.LOST, "lost"),
        (RankState.STALLED, "stalled"),
    ):
        if state in states:
            return word
    if states == {RankState.FINISHED}:
        return "finished"
    if states <= {RankState.PAUSED, RankState.FINISHED}:
        return "paused"
    if ranks < world:
        return "partial"
    return "running"
