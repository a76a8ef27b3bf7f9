"""The rules of one rank's health, each defined once: what a rank's records left known of it
(``RankFacts``), how that moves with a step (``advance``), and the state it puts the rank in at
a time (``state_of``; ``usual_alive`` for the rank neither ended nor paused, which is all of
them but a few). Pure: times are the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from rankwatch.agent.wire.records import EventRecord, Record, StepRecord

DEFAULT_LOST_AFTER_S = 10.0
DEFAULT_STALL_FACTOR = 10.0
DEFAULT_MIN_STALL_S = 30.0
LOST_MARGIN_S = 2.0  # slack on an announced heartbeat interval (transport, batching)
STEP_EWMA_ALPHA = 0.2  # weight of the newest step interval in the typical step time


class RankState(str, Enum):
    ALIVE = "alive"
    STALLED = "stalled"
    LOST = "lost"
    FINISHED = "finished"
    CRASHED = "crashed"
    PAUSED = "paused"


OVER_STATES = frozenset((RankState.FINISHED, RankState.CRASHED, RankState.LOST))  # for good


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


HEALTH_FIELDS = tuple(RankHealth.__dataclass_fields__)


class RankFacts:
    """What one rank's records left known of it (the tracker's, mutable)."""

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


def limits(
    r: RankFacts, lost_after_s: float, min_stall_s: float, stall_factor: float
) -> tuple[float, float]:
    """The silence after which the rank is lost (a rank announcing a long checkpoint in its
    heartbeat's ``next_in`` is given that long, twice, with a margin), and how long its step
    may stay put while it is heard from before it is stalled (``stall_factor`` typical steps)."""
    next_in, step_time = r.next_in, r.step_time
    return (
        lost_after_s if next_in is None else max(lost_after_s, 2 * next_in + LOST_MARGIN_S),
        min_stall_s if step_time is None else max(min_stall_s, stall_factor * step_time),
    )


def usual_alive(
    r: RankFacts, judged: float, lost_after_s: float, min_stall_s: float, stall_factor: float
) -> bool:
    """Whether ``state_of`` says alive, for a rank neither ended nor paused (``terminal`` and
    ``paused_until`` None): the question every record of such a rank asks, without the words."""
    silent = judged - r.last_seen
    stuck = judged - max(r.last_progress, 0.0)
    if silent <= lost_after_s and (r.last_step is None or stuck <= min_stall_s):
        return True  # within the least ``limits`` can be: what most records find
    lost, stall = limits(r, lost_after_s, min_stall_s, stall_factor)
    return not silent > lost and (r.last_step is None or not stuck > stall)


def state_of(
    r: RankFacts,
    now: float,
    judged: float,
    lost_after_s: float,
    min_stall_s: float,
    stall_factor: float,
) -> tuple[RankState, str, float]:
    """The rank's state at ``now``, why (for people) and since when. Silence and stalls are
    measured up to ``judged`` (what the aggregator has taken in, at most ``now``)."""
    if r.terminal is not None:
        return r.terminal, r.message, r.since
    paused = r.paused_until
    if paused is None and usual_alive(r, judged, lost_after_s, min_stall_s, stall_factor):
        return RankState.ALIVE, "", r.since
    if paused is not None and now < paused:
        return RankState.PAUSED, f"paused ({r.pause_reason}), {paused - now:.0f} s left", r.since
    silent = judged - r.last_seen
    lost, stall = limits(r, lost_after_s, min_stall_s, stall_factor)
    if paused is not None:  # an announced pause that overran
        lost = max(lost, paused - r.last_seen + lost)
    if silent > lost:
        return RankState.LOST, f"no record for {silent:.0f} s", r.last_seen + lost
    resumed = max(r.last_progress, paused or 0.0)
    if r.last_step is not None and judged - resumed > stall:
        stuck = judged - resumed
        return (
            RankState.STALLED,
            f"step {r.last_step} has not advanced for {stuck:.0f} s",
            resumed + stall,
        )
    return RankState.ALIVE, "", r.since


def advance(r: RankFacts, step: int, rank_time: float, now: float, logged: float | None) -> None:
    """A step record's progress: a newer step moves the rank on, and its typical step time
    (EWMA) learns the interval, measured on the rank's own clock (no transport jitter), or the
    ``step_time`` it logged when it has no earlier step to measure from."""
    last = r.last_step
    if last is not None and step <= last:
        return
    interval = None
    prev = r.prev_step_time
    if last is not None and prev is not None:
        interval = (rank_time - prev) / (step - last)
        if not (interval > 0 and math.isfinite(interval)):
            interval = None
    elif logged is not None and logged > 0 and math.isfinite(logged):
        interval = logged
    if interval is not None:
        old = r.step_time
        r.step_time = interval if old is None else old + STEP_EWMA_ALPHA * (interval - old)
    r.last_step, r.prev_step_time, r.last_progress = step, rank_time, now


def end_pause(r: RankFacts, now: float) -> None:
    if r.paused_until is not None:
        # The stall clock restarts when an announced pause ends, not at the last step before it.
        r.last_progress = max(r.last_progress, min(now, r.paused_until))
        r.paused_until = None


def reopens(r: RankFacts, rec: Record) -> bool:
    """Does ``rec`` bring a finished/crashed rank back? Newer seq, or a new process (but for
    the end or crash of one)."""
    if isinstance(rec, EventRecord):
        if rec.event == "start":
            return True
        if rec.event in ("end", "crash"):
            return rec.seq > r.end_seq
    if isinstance(rec, (StepRecord, EventRecord)):
        return step_reopens(r, rec.seq, rec.pid)
    return rec.seq > r.end_seq


def step_reopens(r: RankFacts, seq: int, pid: int) -> bool:
    """``reopens`` of a step record, from its seq and pid alone."""
    return seq > r.end_seq or pid != r.pid


def clear_terminal(r: RankFacts) -> None:
    if r.terminal is not None:
        r.terminal = None
        r.message = ""
        r.end_seq = 0
