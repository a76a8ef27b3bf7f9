"""RankTable: a run's health table as blocks shared between snapshots. Each case replays
batches of replacements and checks every table made against a plain dict and a pass
(``tally_of``): content, rank order, the tables before left as they were, and the tally kept
up (counts, odd ranks, maxima, also after the rank holding a maximum moved back)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from rankwatch.aggregator.health import RankHealth, RankState, RankTable
from rankwatch.aggregator.health.table import BLOCK_RANKS, tally_of
from rankwatch.aggregator.ranksummary import digest

A, L, S, C, F, P = (RankState.ALIVE, RankState.LOST, RankState.STALLED, RankState.CRASHED,
                    RankState.FINISHED, RankState.PAUSED)  # fmt: skip
Batch = list[tuple[int, RankHealth]]


def h(rank: int, state: RankState = A, **kw: object) -> RankHealth:
    base = RankHealth("r", rank, state, "h", 1, 8, 10, 100.0, 0.0, "", 0, 1.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def alive(ranks: range | list[int], **kw: object) -> Batch:
    return [(r, h(r, **kw)) for r in ranks]


CASES: dict[str, tuple[Batch, list[Batch]]] = {
    "empty, then ranks": ([], [alive([3, 1, 2]), alive([0])]),
    "a state change and back": (
        alive(range(10)),
        [[(4, h(4, L)), (7, h(7, C))], [(4, h(4))], [(7, h(7, F))]],
    ),
    "new ranks below the lowest and between": (
        alive(range(100, 400, 3)),
        [alive([5, 1]), alive([150, 151, 399, 401]), alive([0])],
    ),
    "two relays interleaved, blocks split": (
        [],
        [alive([*range(i, i + 50), *range(5000 + i, 5000 + i + 50)]) for i in range(0, 500, 50)],
    ),
    "one block grows past two": (alive([0, 10_000]), [alive(range(1, 400)), alive([200])]),
    "dropping records is odd": (alive(range(8)), [[(3, h(3, dropped=2))], [(3, h(3))]]),
    "the furthest step moves back": (
        alive(range(8)),
        [[(5, h(5, last_step=50))], [(5, h(5, last_step=None))], [(2, h(2, last_step=11))]],
    ),
    "the world shrinks": (alive(range(4), world_size=16), [alive(range(4), world_size=8)]),
    "the newest record moves back": (
        alive(range(4)),
        [[(1, h(1, last_seen=300.0))], [(1, h(1, last_seen=50.0))]],
    ),
    "every state, odd ranks out of order": (
        alive(range(0, 200, 2)),
        [[(9, h(9, P)), (3, h(3, S)), (1, h(1, L))], [(3, h(3)), (5, h(5, C))]],
    ),
}


@pytest.mark.parametrize("tally_first", [True, False], ids=["tally kept", "tally counted"])
@pytest.mark.parametrize("case", list(CASES))
def test_replaced_matches_a_dict_and_a_pass(case: str, tally_first: bool) -> None:
    start, batches = CASES[case]
    table, want = RankTable(start), dict(start)
    made: list[tuple[RankTable, dict[int, RankHealth]]] = [(table, dict(want))]
    for batch in batches:
        if tally_first:  # the tally is then kept up through ``replaced``
            table.tally()
        table = table.replaced(batch)
        want.update(batch)
        made.append((table, dict(want)))
    for t, expected in made:  # each table as it was made, the later ones notwithstanding
        assert list(t) == sorted(expected)
        assert list(t.items()) == sorted(expected.items())
        assert list(t.values()) == [expected[r] for r in sorted(expected)]
        assert len(t) == len(expected) and t == expected
        assert all(t[r] is expected[r] and r in t for r in expected)
        assert t.get(-1) is None and -1 not in t and "x" not in t
        want_tally = tally_of(expected[r] for r in sorted(expected))
        assert t.tally() == want_tally and list(t.tally().odd) == list(want_tally.odd)
        assert digest(t) == digest(expected)


REMOVALS = [  # (ranks at the start, ranks removed, ranks added)
    (range(10), [0, 5], []),
    (range(200), list(range(64, 128)), []),  # a whole block
    (range(200), list(range(200)), [300]),  # every block, one new
    (range(3), [9], [1]),  # not there: nothing to remove
]


@pytest.mark.parametrize(("start", "removed", "added"), REMOVALS)
def test_replaced_removes_ranks(start: range, removed: list[int], added: list[int]) -> None:
    table = RankTable(alive(start))
    fresh = table.replaced(alive(added), removed)
    want = sorted({*start, *added} - set(removed))
    assert list(fresh) == want and len(fresh) == len(want) and list(table) == list(start)
    assert all(fresh[r].rank == r for r in want)


def test_replaced_copies_only_the_blocks_its_ranks_fall_in() -> None:
    table = RankTable(alive(range(100 * BLOCK_RANKS)))
    fresh = table.replaced([(5, h(5, L)), (50 * BLOCK_RANKS, h(50 * BLOCK_RANKS, L))])
    shared = sum(a is b for a, b in zip(table._blocks, fresh._blocks, strict=True))
    assert shared == 98 and fresh[5].state is L and table[5].state is A


def test_a_long_random_walk_matches_a_dict_and_a_pass() -> None:
    rng = random.Random(24)
    table, want = RankTable(), {}
    states = list(RankState)
    for k in range(200):
        batch = []
        for r in rng.sample(range(3000), rng.randrange(1, 60)):
            step, seen = rng.choice([None, k, k // 2]), float(rng.randrange(1000))
            world, dropped = rng.randrange(1, 9), rng.choice([0, 0, 0, 1])
            entry = h(r, rng.choice(states), last_step=step, last_seen=seen, world_size=world,
                      dropped=dropped)  # fmt: skip
            batch.append((r, entry))
        if k % 7:
            table.tally()
        table = table.replaced(batch)
        want.update(batch)
        assert list(table.items()) == sorted(want.items())
        assert table.tally() == tally_of(want[r] for r in sorted(want))
