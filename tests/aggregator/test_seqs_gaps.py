"""SeqTracker.gaps(limit=...) and gap_count(): the first gaps without building all of them."""

from __future__ import annotations

import random

import pytest
from rankwatch.aggregator.seqs import SeqTracker

CASES = [
    [],  # nothing seen
    [1, 2, 3],  # no gap
    [3, 4],  # a gap before the first seq only
    [1, 5, 3],  # gaps between intervals only
    [4, 6, 9, 10, 20],  # both kinds
    [2],  # one seq, one gap before it
]


def tracker(seqs: list[int]) -> SeqTracker:
    t = SeqTracker()
    for s in seqs:
        t.accept("r", 0, s)
    return t


@pytest.mark.parametrize("seqs", CASES)
@pytest.mark.parametrize("limit", [None, 0, 1, 2, 3, 100])
def test_limit_returns_the_oldest_gaps_first(seqs: list[int], limit: int | None) -> None:
    t = tracker(seqs)
    every = t.gaps("r", 0)
    assert t.gaps("r", 0, limit=limit) == (every if limit is None else every[:limit])
    assert t.gap_count("r", 0) == len(every)


@pytest.mark.parametrize(
    ("seqs", "first", "count"),
    [([], [], 0), ([1, 2], [], 0), ([3], [(1, 2)], 1), ([1, 4, 7], [(2, 3)], 2)],
)
def test_first_gap_and_count(seqs: list[int], first: list[tuple[int, int]], count: int) -> None:
    t = tracker(seqs)
    assert t.gaps("r", 0, limit=1) == first
    assert t.gap_count("r", 0) == count
    assert t.gap_count("other", 0) == 0 and t.gaps("other", 0, limit=1) == []


def test_many_gaps_limit_and_count_agree_with_the_full_list() -> None:
    t = SeqTracker()
    rng = random.Random(7)
    seqs = rng.sample(range(1, 400_001), 150_000)  # about 100k gaps
    for s in seqs:
        t.accept("r", 0, s)
    every = t.gaps("r", 0)
    assert len(every) > 50_000
    assert t.gap_count("r", 0) == len(every)
    assert t.gaps("r", 0, limit=20) == every[:20]
    assert t.gaps("r", 0, limit=len(every) + 5) == every


def test_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 0"):
        tracker([1, 3]).gaps("r", 0, limit=-1)
