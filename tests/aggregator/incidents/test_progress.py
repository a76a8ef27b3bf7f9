"""The least-progress culprits kept between judgements (``progress.KeptLeast``) against the
answer made from every candidate each time, over seeded sequences of what a hang brings: more
stalls, ranks moving on or back (a restart), ranks leaving the candidates, unknown ranks, ranks
before their first step, and a moves log that drops its oldest half."""

from __future__ import annotations

import random

import pytest
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents import progress
from rankwatch.aggregator.incidents.progress import KeptLeast, Moves, least_progress

from tests.aggregator.incidents.builders import T0, health

SEEDS = range(40)


def _moved(rng: random.Random, r: int) -> RankHealth:
    step = rng.choice([17, 18, 19, 19, 19, 20, None]) if rng.random() < 0.9 else None
    return health(r, RankState.STALLED, step=step, progress=T0 + rng.choice([0.0, 0.0, 0.5, 2.0]))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_kept_answer_is_the_one_made_from_every_candidate(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(progress, "MOVES_MIN", rng.choice([8, 64, 4096]))
    n = rng.randint(2, 200)
    table: dict[int, RankHealth] = {}
    moves, kept = Moves(), KeptLeast()
    candidates: set[int] = set()
    judged = rng.choice([0.8, 0.3])  # of the changes, how many a judgement follows
    for _ in range(60):
        pick = rng.random()
        if pick < 0.4 or not candidates:  # more ranks stall (some the health table lacks)
            for r in rng.sample(range(n), rng.randint(1, max(1, n // 4))):
                candidates.add(r)
        elif pick < 0.5:  # a few leave (recovered, their evidence over)
            for r in rng.sample(sorted(candidates), min(len(candidates) - 1, rng.randint(1, 3))):
                candidates.discard(r)
        ranks = [r for r in range(n) if rng.random() < rng.choice([0.0, 0.05, 0.3])]
        ranks = [r for r in ranks if rng.random() < 0.97]  # and now and then one stays unknown
        values = [_moved(rng, r) for r in ranks]
        table.update(zip(ranks, values, strict=True))
        moves.add(ranks, len(table))
        if rng.random() < judged:
            assert kept(set(candidates), table, moves) == least_progress(candidates, table)


def test_a_least_rank_moving_on_makes_the_answer_again() -> None:
    table = {r: health(r, RankState.STALLED, step=19, progress=T0 + r) for r in range(5)}
    moves, kept = Moves(), KeptLeast()
    assert kept({0, 1, 2, 3, 4}, table, moves) == (0,)
    table[0] = health(0, RankState.STALLED, step=20, progress=T0)
    moves.add([0], len(table))
    # rank 1 is least now, though no rank it was compared with moved
    assert kept({0, 1, 2, 3, 4}, table, moves) == (1,)
    table[3] = health(3, RankState.STALLED, step=4, progress=T0)  # restarted, back at step 4
    moves.add([3], len(table))
    assert kept({0, 1, 2, 3, 4}, table, moves) == (3,)
    assert kept({0, 1, 2, 4}, table, moves) == (1,)  # the least left the candidates


def test_the_log_drops_its_oldest_half_and_says_when_it_no_longer_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "MOVES_MIN", 4)
    moves = Moves()
    moves.add([1, 2, 3], known=2)
    assert moves.since(1) == [2, 3]
    moves.add([4, 5], known=2)  # 5 held, more than max(4, 2 * 2): the oldest 2 dropped
    assert (moves.base, moves.ranks, moves.end) == (2, [3, 4, 5], 5)
    assert moves.since(1) is None
    assert moves.since(3) == [4, 5]
    assert moves.since(5) == []


def test_a_hang_judged_per_tick_is_looked_at_again_only_where_it_changed() -> None:
    """The kept answer reads the health of the ranks new or moved since, not every candidate's:
    a table that counts its reads proves it."""

    class Counted(dict[int, RankHealth]):
        reads = 0

        def get(self, key, default=None):  # type: ignore[no-untyped-def, override]
            Counted.reads += 1
            return super().get(key, default)

        def __getitem__(self, key: int) -> RankHealth:
            Counted.reads += 1
            return super().__getitem__(key)

    table = Counted({r: health(r, RankState.STALLED, step=19, progress=T0) for r in range(1000)})
    moves, kept = Moves(), KeptLeast()
    candidates = set(range(500))
    assert kept(set(candidates), table, moves) == tuple(range(500))
    Counted.reads = 0
    for tick in range(5):
        part = range(500 + 10 * tick, 510 + 10 * tick)
        for r in part:
            table[r] = health(r, RankState.STALLED, step=19, progress=T0 + 1 + tick)
        moves.add(list(part), len(table))
        candidates |= set(part)
        assert kept(set(candidates), table, moves) == tuple(range(500))
    assert Counted.reads == 50
