"""SeqTracker: duplicates, gaps, restart, memory bounds."""

from __future__ import annotations

import random

import pytest
from rankwatch.aggregator.seqs import SeqTracker


@pytest.mark.parametrize(
    ("seqs", "accepted", "gaps", "max_seq"),
    [
        ([1, 2, 3], [True, True, True], [], 3),
        ([1, 2, 2, 3, 1], [True, True, False, True, False], [], 3),
        ([1, 5, 3], [True, True, True], [(2, 2), (4, 4)], 5),
        ([3, 4], [True, True], [(1, 2)], 4),
        ([1, 5, 3, 2, 4, 4], [True, True, True, True, True, False], [], 5),
        ([10, 8, 9, 1], [True, True, True, True], [(2, 7)], 10),
    ],
)
def test_seq_tracker_table(
    seqs: list[int], accepted: list[bool], gaps: list[tuple[int, int]], max_seq: int
) -> None:
    t = SeqTracker()
    assert [t.accept("r", 0, s) for s in seqs] == accepted
    assert t.gaps("r", 0) == gaps
    assert t.max_seq("r", 0) == max_seq


def test_seq_tracker_keys_are_per_run_and_rank() -> None:
    t = SeqTracker()
    assert t.accept("a", 0, 1)
    assert t.accept("a", 1, 1)
    assert t.accept("b", 0, 1)
    assert not t.accept("a", 0, 1)
    assert t.max_seq("nobody", 3) == 0
    assert t.gaps("nobody", 3) == []


def test_seq_tracker_memory_is_intervals_not_records() -> None:
    t = SeqTracker()
    for s in range(1, 100_001):
        if s % 10_000 != 0:  # nine gaps in 100k records
            t.accept("r", 0, s)
    assert len(t.intervals("r", 0)) == 10
    assert t.gaps("r", 0) == [(k, k) for k in range(10_000, 100_000, 10_000)]


def test_seq_tracker_random_order_matches_a_set() -> None:
    rng = random.Random(7)
    seqs = [rng.randint(1, 300) for _ in range(2_000)]
    t, seen = SeqTracker(), set()
    for s in seqs:
        assert t.accept("r", 0, s) == (s not in seen)
        seen.add(s)
    missing = sorted(set(range(1, max(seen) + 1)) - seen)
    flat = [s for lo, hi in t.gaps("r", 0) for s in range(lo, hi + 1)]
    assert flat == missing


def test_seq_tracker_load_rebuilds_after_restart() -> None:
    t = SeqTracker()
    t.load("r", 0, 5, 9)
    t.load("r", 0, 1, 2)
    t.load("r", 0, 8, 12)  # overlapping ranges from the store merge
    assert t.intervals("r", 0) == [(1, 2), (5, 12)]
    assert t.gaps("r", 0) == [(3, 4)]
    assert not t.accept("r", 0, 7)
    assert t.accept("r", 0, 3)
    with pytest.raises(ValueError, match="empty"):
        t.load("r", 0, 4, 3)


def test_seq_tracker_caps_intervals_and_counts_what_it_gave_up() -> None:
    t = SeqTracker(max_intervals=3)
    for s in (1, 3, 5, 7, 9):
        t.accept("r", 0, s)
    assert len(t.intervals("r", 0)) == 3
    assert t.given_up == 2
    assert t.max_seq("r", 0) == 9


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_intervals"):
        SeqTracker(max_intervals=1)
