"""A big run's summary: counts by state, the odd ranks most urgent first, pages, the digest
cache; and the health parts it stands on (refresh of the touched ranks only, gapped seqs)."""

from __future__ import annotations

import dataclasses

import pytest
from rankwatch.agent.wire.records import EventRecord, Heartbeat, StepRecord
from rankwatch.aggregator.health import HealthTracker, RankHealth, RankState
from rankwatch.aggregator.ranksummary import (
    MAX_PAGE_RANKS,
    DigestCache,
    digest,
    odd_ranks,
    page_ranks,
    summary_fields,
)
from rankwatch.aggregator.restarts import Restarts
from rankwatch.aggregator.seqs import SeqTracker

T0 = 1_000.0


def health(rank: int, state: RankState = RankState.ALIVE, **kw: object) -> RankHealth:
    base = RankHealth("r", rank, state, "h", 1, 8, 10, T0, T0, "", 0, 1.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def step(rank: int, seq: int, step: int = 1) -> StepRecord:
    return StepRecord("r", rank, seq, T0, 4, "h", 1, step, 0, {"loss": 1.0})


def test_digest_counts_states_and_notes_odd_ranks_by_health() -> None:
    states = {r: health(r) for r in range(10)}
    states[3] = health(3, RankState.LOST)
    states[5] = health(5, RankState.CRASHED, last_step=12, last_seen=T0 + 5)
    states[7] = health(7, dropped=4)  # alive, but its agent drops records
    d = digest(states)
    assert d.ranks == 10
    assert d.rank_states == {"alive": 8, "lost": 1, "crashed": 1}
    assert sorted(d.by_health) == [3, 5, 7]
    assert d.state == "crashed" and d.world_size == 8
    assert d.last_step == 12 and d.last_time == T0 + 5


def test_odd_ranks_most_urgent_first_within_the_limit() -> None:
    states = {r: health(r) for r in range(100)}
    states[90] = health(90, RankState.CRASHED)
    states[40] = health(40, RankState.STALLED)
    d = digest(states)
    listed, odd = odd_ranks(d, flagged=[60, 70], gapped=[10, 40], limit=3)
    # crashed, stalled, then the first divergent; the second divergent and the gap are counted
    assert listed == [40, 60, 90]
    assert odd == 5
    fields = summary_fields(d, odd, None)
    assert fields["ranks_summarised"] is True and fields["ranks_odd"] == 5
    assert "ranks_offset" not in fields


def test_in_a_cascade_of_every_rank_the_ranks_that_started_it_are_among_those_listed() -> None:
    states = {r: health(r) for r in range(5000)}
    states[4000] = health(4000, RankState.LOST)  # more urgent than any divergence: first
    d = digest(states)
    every = range(5000)  # every rank flagged; 3210 first, then 12 and 7 (in that order)
    listed, odd = odd_ranks(d, flagged=every, gapped=[], limit=4, first=[3210, 12, 3210, 7])
    assert listed == [7, 12, 3210, 4000] and odd == 5000
    # without the order of the earliest divergences: the lowest ranks, the culprit left out
    assert odd_ranks(d, flagged=every, gapped=[], limit=4)[0] == [0, 1, 2, 4000]
    # a rank of ``first`` that is not odd is not listed for it
    assert odd_ranks(d, flagged=[5, 6], gapped=[], limit=4, first=[99, 6])[0] == [5, 6, 4000]


def test_pages_are_in_rank_order_and_bounded() -> None:
    ranks = [5, 3, 9, 1, 7]
    assert page_ranks(ranks, 1, 2) == [3, 5]
    assert page_ranks(ranks, 4, 10) == [9]
    assert page_ranks(ranks, 9, 10) == []
    for offset, limit in ((-1, 5), (0, 0), (0, MAX_PAGE_RANKS + 1)):
        with pytest.raises(ValueError, match="offset must be >= 0"):
            page_ranks(ranks, offset, limit)


def test_digest_cache_computes_again_only_for_a_new_snapshot() -> None:
    cache = DigestCache()
    states = {0: health(0), 1: health(1)}
    first = cache.get("r", states, T0)
    assert cache.get("r", states, T0 + 5) is first  # the same snapshot: the same digest
    values = {("r", 0): {"loss": 1.0}, ("r", 1): {"lr": 0.1}}
    assert cache.metrics("r", states, values, T0) == ["loss", "lr"]
    # a new snapshot of the same ranks within DIGEST_EVERY_S: the digest still holds
    again = {0: health(0), 1: health(1, RankState.STALLED)}
    assert cache.get("r", again, T0 + 0.5) is first
    assert cache.get("r", again, T0 + 1.5).rank_states == {"alive": 1, "stalled": 1}
    newer = {**again, 2: health(2, RankState.LOST)}  # ranks came: at once
    assert cache.get("r", newer, T0 + 1.6).rank_states == {"alive": 1, "stalled": 1, "lost": 1}
    cache.forget_others([])
    assert cache.get("r", newer, T0 + 1.6) is not first


def test_refresh_evaluates_only_the_ranks_whose_records_can_change_a_state() -> None:
    tracker = HealthTracker()
    for rank in (0, 2):
        tracker.observe(step(rank, 1), T0)
    swept = tracker.snapshot(T0)
    tracker.observe(step(0, 2, step=2), T0 + 1)  # an alive rank stepping: no state change
    tracker.observe(step(1, 1), T0 + 1)  # a new rank
    crash = EventRecord("r", 2, 2, T0, 4, "h", 1, "crash", 1, {"exc_type": "OOM"})
    tracker.observe(crash, T0 + 1)
    fresh, touched = tracker.refresh(swept, T0 + 1)
    assert touched == {("r", 1), ("r", 2)}
    assert list(fresh["r"]) == [0, 1, 2]  # a new rank in its place
    assert fresh["r"][2].state is RankState.CRASHED
    assert fresh["r"][0] is swept["r"][0]  # as the sweep saw it (step 1)
    assert list(swept["r"]) == [0, 2]  # the sweep's own snapshot is left as it was
    changed = tracker.changes(T0 + 1, fresh, only=touched)
    assert sorted((h.rank, old) for h, old in changed) == [(1, ""), (2, "")]
    tracker.observe(Heartbeat("r", 1, 2, T0, 1, 5.0, 0), T0 + 2)  # alive: nothing to refresh
    assert tracker.refresh(fresh, T0 + 2)[1] == set()


def test_new_ranks_out_of_order_join_the_table_in_their_place() -> None:
    """Two relays' new ranks interleaved: each refresh puts them in rank order, and shares the
    entries it did not evaluate again with the table before."""
    tracker = HealthTracker()
    for rank in (0, 1, 8, 9):
        tracker.observe(step(rank, 1), T0)
    swept = tracker.snapshot(T0)
    for rank in (2, 10, 3):
        tracker.observe(step(rank, 1), T0 + 1)
    fresh, _ = tracker.refresh(swept, T0 + 1)
    assert list(fresh["r"]) == [0, 1, 2, 3, 8, 9, 10]
    tracker.observe(step(4, 1), T0 + 2)
    later, touched = tracker.refresh(fresh, T0 + 2)
    assert list(later["r"]) == [0, 1, 2, 3, 4, 8, 9, 10] and touched == {("r", 4)}
    assert later["r"][2] is fresh["r"][2] and list(fresh["r"]) == [0, 1, 2, 3, 8, 9, 10]


def test_gapped_lists_the_sequences_with_a_gap_until_it_closes() -> None:
    seqs = SeqTracker()
    for s in (1, 2, 3):
        seqs.accept("r", 0, s)
    seqs.accept("r", 1, 1)
    seqs.accept("r", 1, 4)  # 2..3 missing
    assert seqs.gapped("r") == [("r", 1, 0)]
    assert seqs.accept_many("r", 2, [5, 6]) is None  # both new
    assert ("r", 2, 0) in seqs.gapped()  # a rank first heard at seq 5: 1..4 missing
    seqs.accept_many("r", 1, [2, 3])
    assert ("r", 1, 0) not in seqs.gapped("r")
    seqs.load("s", 0, 3, 9)
    assert seqs.gapped("s") == [("s", 0, 0)]
    seqs.forget("s")
    assert seqs.gapped("s") == []


def test_a_sweep_of_many_ranks_rolls_over_the_ticks_and_still_finds_a_lost_rank() -> None:
    from rankwatch.aggregator.healthview import ROLLING_RANKS, HealthView

    tracker = HealthTracker(lost_after_s=10.0)
    ranks = ROLLING_RANKS + 904  # 5,000
    for rank in range(ranks):
        tracker.observe(step(rank, 1), T0)
    # a sweep timed as free, however loaded the machine is: one every HEALTH_EVERY_S (1 s)
    view = HealthView(tracker, timer=lambda: 0.0)
    view.snapshot(T0)  # the first: every rank
    assert view.take_evaluated() is None
    evaluated = []
    real = tracker._health

    def counting(*args: object) -> RankHealth:
        evaluated.append(args[1])
        return real(*args)  # type: ignore[arg-type]

    tracker._health = counting  # type: ignore[method-assign]
    lost_at = None
    t = T0
    while t < T0 + 30 and lost_at is None:
        t += 0.2
        for rank in range(ranks):
            if rank != 42 and int((t - T0) * 5) % 25 == 0:  # every rank but 42 says it lives
                tracker.observe(Heartbeat("r", rank, 2, t, 1, 5.0, 0), t)
        evaluated.clear()
        snap = view.snapshot(t)
        assert len(evaluated) <= ranks // 4  # a share per tick (0.2 s of 1 s), never all
        # what the straggler rule updates its steps by
        assert view.take_evaluated() == {("r", r) for r in evaluated}
        if any(h.rank == 42 and h.state is RankState.LOST for h, _ in view.changes(t, snap)):
            lost_at = t
    # silent from T0: lost after 10 s, found within one rolling sweep (1 s) of that
    assert lost_at is not None and T0 + 10 < lost_at <= T0 + 10 + 1.0 + 0.2
    assert view.sweeps >= 5 and view.take_swept()


def test_the_odd_ranks_are_made_again_only_when_what_they_read_changed() -> None:
    cache = DigestCache()
    states = {r: health(r, RankState.LOST if r % 2 else RankState.ALIVE) for r in range(8)}
    d = cache.get("r", states, T0)
    made: list[tuple[int, ...]] = []

    def make(flagged: tuple[int, ...] = (), gapped: tuple[int, ...] = ()) -> tuple[list[int], int]:
        made.append(flagged + gapped)
        return odd_ranks(d, flagged, gapped)

    assert cache.odd("r", states, T0, ((), 0), make) == ([1, 3, 5, 7], 4)
    listed, _ = cache.odd("r", states, T0 + 0.5, ((), 0), make)
    listed.append(99)  # the caller's own list: the memo's is left as it was
    assert cache.odd("r", states, T0 + 0.5, ((), 0), make) == ([1, 3, 5, 7], 4)
    assert len(made) == 1
    # a rank flagged, a gap opened: made again at once, the digest's window notwithstanding
    assert cache.odd("r", states, T0 + 0.6, ((2,), 0), lambda: make((2,))) == ([1, 2, 3, 5, 7], 5)
    got = cache.odd("r", states, T0 + 0.7, ((2,), 1), lambda: make((2,), (4,)))
    assert got == ([1, 2, 3, 4, 5, 7], 6) and len(made) == 3


def test_the_gap_and_incarnation_versions_count_what_the_odd_ranks_read() -> None:
    seqs = SeqTracker()
    seqs.accept("r", 0, 1)
    seqs.accept("r", 0, 3)  # a gap opens
    opened = seqs.gap_version
    assert opened > 0
    seqs.accept("r", 0, 5)  # another gap behind the first: the same ranks have gaps
    seqs.accept("r", 0, 6)
    assert seqs.gap_version == opened
    seqs.accept_many("r", 0, [2, 4])  # both filled: no gap left
    assert seqs.gap_version == opened + 1 and seqs.gapped("r") == []
    restarts = Restarts()
    restarts.observe(step(0, 1))
    first = restarts.version
    restarts.observe(step(0, 2, step=2))  # the same incarnation going on
    assert restarts.version == first
    restarts.observe(dataclasses.replace(step(0, 1, step=3), inc=7))  # a restart
    assert restarts.version == first + 1 and restarts.current("r", 0) == 7
