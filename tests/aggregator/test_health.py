"""Rank health: a table of record timelines and the state they lead to, with no sleeping."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from rankwatch.agent.wire.records import EventRecord, Heartbeat, RanksBlock, Record, StepRecord
from rankwatch.aggregator.health import HealthTracker, RankHealth, RankState, run_state

A, S, L, F, C, P = (
    RankState.ALIVE,
    RankState.STALLED,
    RankState.LOST,
    RankState.FINISHED,
    RankState.CRASHED,
    RankState.PAUSED,
)


class Clock:
    """Builds records for one rank with increasing seqs (the rank's clock == the test's)."""

    def __init__(self, rank: int = 0, run: str = "r", pid: int = 100) -> None:
        self.rank, self.run, self.pid, self.seq = rank, run, pid, 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def step(self, t: float, step: int, **metrics: float) -> StepRecord:
        return StepRecord(
            self.run, self.rank, self._next(), t, 4, "node1", self.pid, step, None, metrics
        )

    def hb(
        self, t: float, last_step: int | None, next_in: float = 5.0, dropped: int = 0, **kw: Any
    ) -> Heartbeat:
        return Heartbeat(self.run, self.rank, self._next(), t, last_step, next_in, dropped, **kw)

    def event(self, t: float, kind: str, step: int | None = None, **info: Any) -> EventRecord:
        return EventRecord(
            self.run, self.rank, self._next(), t, 4, "node1", self.pid, kind, step, info
        )


def replay(
    timeline: list[tuple[float, Record]], tracker: HealthTracker | None = None
) -> HealthTracker:
    tracker = tracker or HealthTracker()
    for now, rec in timeline:
        tracker.observe(rec, now)
    return tracker


def state(tracker: HealthTracker, now: float, rank: int = 0) -> RankHealth:
    return tracker.snapshot(now)["r"][rank]


def steps(n: int, every: float = 1.0, start: float = 0.0) -> list[tuple[float, Record]]:
    k = Clock()
    return [(start + i * every, k.step(start + i * every, i)) for i in range(n)]


def _timeline(kind: str) -> list[tuple[float, Record]]:
    k = Clock()
    if kind == "steps":
        return [(float(i), k.step(float(i), i)) for i in range(10)]
    if kind == "heartbeats_no_steps":  # step 9 at t=9, then only heartbeats
        return [(float(i), k.step(float(i), i)) for i in range(10)] + [
            (float(t), k.hb(float(t), 9)) for t in range(14, 200, 5)
        ]
    if kind == "slow_steps":  # 20 s per step: stalled only after 10 x 20 s
        return [(20.0 * i, k.step(20.0 * i, i)) for i in range(5)] + [
            (float(t), k.hb(float(t), 4)) for t in range(85, 400, 5)
        ]
    if kind == "long_heartbeat":  # announces a 60 s interval (a checkpoint)
        return [(0.0, k.step(0.0, 1)), (1.0, k.hb(1.0, 1, next_in=60.0))]
    if kind == "pause":
        return [(0.0, k.step(0.0, 1)), (1.0, k.event(1.0, "pause", seconds=300, reason="ckpt"))]
    if kind == "paused_heartbeat":
        return [(0.0, k.step(0.0, 1)), (1.0, k.hb(1.0, 1, next_in=120.0, paused="checkpoint"))]
    if kind == "end":
        return [(0.0, k.step(0.0, 1)), (1.0, k.event(1.0, "end", reason="normal"))]
    if kind == "crash":
        return [
            (0.0, k.step(0.0, 1)),
            (1.0, k.event(1.0, "crash", 7, exc_type="RuntimeError", message="CUDA error")),
        ]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("timeline", "now", "expected", "message"),
    [
        ("steps", 10.0, A, ""),
        ("steps", 19.0, A, ""),  # 10 s silent: not yet lost (lost_after_s=10)
        ("steps", 19.5, L, "no record for 10 s"),
        ("heartbeats_no_steps", 38.0, A, ""),  # 29 s without progress < min_stall_s
        ("heartbeats_no_steps", 40.0, S, "step 9 has not advanced for 31 s"),
        ("slow_steps", 200.0, A, ""),  # 120 s without a step, typical step 20 s: < 200 s
        ("slow_steps", 290.0, S, "step 4 has not advanced"),
        ("long_heartbeat", 25.0, A, ""),
        ("long_heartbeat", 100.0, S, "step 1 has not advanced"),  # not lost: next hb due in 60 s
        ("long_heartbeat", 123.5, L, "no record for 122 s"),
        ("pause", 200.0, P, "paused (ckpt), 101 s left"),
        ("pause", 305.0, A, ""),  # pause over: lost/stall clocks restart at its end
        ("pause", 312.0, L, ""),
        ("paused_heartbeat", 100.0, P, "paused (checkpoint)"),
        ("end", 1_000.0, F, "finished (normal)"),
        ("crash", 1_000.0, C, "crashed: RuntimeError: CUDA error at step 7"),
    ],
)
def test_state_table(timeline: str, now: float, expected: RankState, message: str) -> None:
    h = state(replay(_timeline(timeline)), now)
    assert h.state is expected
    assert h.message.startswith(message)


def test_health_fields() -> None:
    k = Clock()
    tracker = replay(
        [
            (10.0, k.event(10.0, "start")),
            (11.0, k.step(11.0, 1)),
            (11.5, k.step(11.5, 2)),
            (12.0, k.step(12.0, 3)),
            (12.2, k.hb(12.2, 3, dropped=4)),
        ]
    )
    h = state(tracker, 13.0)
    assert (h.run, h.rank, h.host, h.pid, h.world_size) == ("r", 0, "node1", 100, 4)
    assert (h.last_step, h.first_seen, h.last_seen, h.dropped) == (3, 10.0, 12.2, 4)
    assert h.step_time == pytest.approx(0.5)


def test_step_time_falls_back_to_the_logged_metric() -> None:
    k = Clock()
    tracker = replay([(0.0, k.step(0.0, 1, step_time=2.5))])
    assert state(tracker, 0.0).step_time == 2.5


def test_back_to_alive_when_a_step_arrives() -> None:
    tracker = replay(_timeline("heartbeats_no_steps"))
    assert state(tracker, 40.0).state is S
    tracker.observe(Clock(pid=100).step(41.0, 10), 41.0)
    h = state(tracker, 41.0)
    assert h.state is A and h.since == 41.0


def test_heartbeat_last_step_counts_as_progress() -> None:
    k = Clock()
    timeline = [(0.0, k.step(0.0, 1))] + [(float(t), k.hb(float(t), t)) for t in range(5, 60, 5)]
    assert state(replay(timeline), 60.0).state is A


def test_resume_restarts_the_stall_clock() -> None:
    k = Clock()
    tracker = replay(
        [
            (0.0, k.step(0.0, 1)),
            (1.0, k.event(1.0, "pause", seconds=600)),
            (100.0, k.event(100.0, "resume")),
            (104.0, k.hb(104.0, 1)),
        ]
    )
    assert state(tracker, 105.0).state is A


def test_stale_records_after_the_end_change_nothing_but_a_restart_does() -> None:
    tracker = replay(_timeline("crash"))
    late = StepRecord("r", 0, 1, 0.0, 4, "node1", 100, 1, None, {})  # seq 1: from before
    tracker.observe(late, 50.0)
    assert state(tracker, 50.0).state is C
    restarted = Clock(pid=200)  # a new process: seqs start again at 1
    tracker.observe(restarted.event(60.0, "start"), 60.0)
    tracker.observe(restarted.step(61.0, 1), 61.0)
    assert state(tracker, 61.0).state is A


def test_restart_in_a_container_with_the_same_pid_is_seen_through_its_start_event() -> None:
    tracker = replay(_timeline("crash"))
    again = Clock(pid=100)
    tracker.observe(again.event(60.0, "start"), 60.0)
    assert state(tracker, 60.0).state is A


def test_changes_report_each_transition_once() -> None:
    tracker = replay(steps(5))
    first = tracker.changes(4.0)
    assert [(h.state, old) for h, old in first] == [(A, "")]
    assert tracker.changes(5.0) == []
    (lost,) = tracker.changes(20.0)
    assert (lost[0].state, lost[1]) == (L, "alive")
    assert tracker.changes(21.0) == []


def test_snapshot_is_per_run_and_rank() -> None:
    tracker = HealthTracker()
    for rank in (2, 0, 1):
        tracker.observe(Clock(rank=rank).step(0.0, 1), 0.0)
    tracker.observe(Clock(run="other").step(0.0, 1), 0.0)
    snap = tracker.snapshot(1.0)
    assert list(snap) == ["r", "other"] and list(snap["r"]) == [0, 1, 2]
    tracker.forget("other")
    assert list(tracker.snapshot(1.0)) == ["r"]


@pytest.mark.parametrize(
    "bad", [{"lost_after_s": 0}, {"stall_factor": -1}, {"min_stall_s": float("inf")}]
)
def test_bad_settings_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        HealthTracker(**bad)


def h(state: RankState, rank: int = 0, world: int = 2) -> RankHealth:
    return RankHealth("r", rank, state, "", 0, world, None, 0.0, 0.0, "", 0, None)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], "empty"),
        ([A, A], "running"),
        ([A], "partial"),
        ([A, C], "crashed"),
        ([L, C], "crashed"),
        ([A, L], "lost"),
        ([S, L], "lost"),
        ([A, S], "stalled"),
        ([F, F], "finished"),
        ([F, A], "running"),
        ([P, F], "paused"),
        ([P, A], "running"),
    ],
)
def test_run_state_table(states: list[RankState], expected: str) -> None:
    assert run_state(h(s, rank=i) for i, s in enumerate(states)) == expected


def test_silence_is_judged_up_to_what_was_received_not_the_clock() -> None:
    """Ranks heard until t=10, then the aggregator takes nothing in until t=50 (stopped,
    behind): nobody is lost or stalled for it; once it has taken in up to t=50, the rank
    that really went quiet at t=10 is, and the one whose records were waiting is not."""
    quiet, talker = Clock(0), Clock(1)
    timeline = [(float(t), quiet.step(float(t), t)) for t in range(11)]
    timeline += [(float(t), talker.step(float(t), t)) for t in range(11)]
    tracker = replay(timeline, HealthTracker(lost_after_s=10.0, min_stall_s=5.0, stall_factor=2))
    tracker.heard(10.0)
    assert [h.state for h in tracker.snapshot(50.0)["r"].values()] == [A, A]
    tracker.heard(5.0)  # heard never goes back
    tracker.observe(talker.step(11.0, 11), 50.0)  # what waited, taken in at last
    tracker.heard(50.0)
    now = tracker.snapshot(50.0)["r"]
    assert (now[0].state, now[0].message) == (L, "no record for 40 s")
    assert now[1].state is A
    tracker.heard(56.0)
    assert state(tracker, 60.0, rank=1).state is S  # stalls are judged up to heard as well
    assert state(tracker, 60.0, rank=1).message == "step 11 has not advanced for 6 s"


@pytest.mark.parametrize("logged", [False, True])
def test_a_block_s_rows_observed_one_by_one_are_its_records_observed(logged: bool) -> None:
    """``observe_ranks`` of single rows (a rank's step held until its next record in the
    batch), of a block with and without a logged step_time (a first step has none), leaves
    the states ``observe`` of each row's StepRecord leaves."""
    n = 40
    by_rows, by_records = HealthTracker(), HealthTracker()
    for k, now in enumerate((10.0, 12.0, 14.0)):
        metrics = {"loss": [1.0] * n} | (
            {"step_time": [2.0 + r for r in range(n)]} if logged else {}
        )
        block = RanksBlock("r", n, list(range(n)), [k + 1] * n, [100.0 + 2 * k] * n,
                           [f"h{r // 8}" for r in range(n)], list(range(n)), [k + 1] * n,
                           [0] * n, metrics, [0] * n)  # fmt: skip
        rows = list(range(n))[::-1] if k % 2 else list(range(n))
        for i in rows[: n // 2]:
            by_rows.observe_ranks(block, (i,), now)
        by_rows.observe_ranks(block, rows[n // 2 :], now)
        for i in rows:
            by_records.observe(block.record(i), now)
    for now in (14.0, 20.0, 40.0, 200.0):  # the stall limit comes from the step times
        got, want = by_rows.snapshot(now)["r"], by_records.snapshot(now)["r"]
        assert [dataclasses.astuple(h) for _, h in got.items()] == [
            dataclasses.astuple(h) for _, h in want.items()
        ]
