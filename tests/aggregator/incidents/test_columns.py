"""Evidence column by column: a burst classified, ordered and held as one by one would."""

from __future__ import annotations

import random

import pytest
from rankwatch.aggregator.incidents.columns import Column, Rows
from rankwatch.aggregator.incidents.oneline import (
    _FORMS,
    COLLECTIVE_WORDS,
    _mark_same_place,
    collective_failures,
    is_collective_failure,
)
from rankwatch.aggregator.incidents.rules import NONFINITE, Fact
from rankwatch.aggregator.incidents.scan import positions

from tests.aggregator.incidents.builders import CRASHES, T0

TEXTS = sorted(p.read_text() for p in CRASHES.glob("*.txt"))


@pytest.mark.parametrize("seed", range(3))
def test_a_burst_of_messages_is_classified_as_each_alone(seed: int) -> None:
    rng = random.Random(seed)
    # every fixture, and each behind 300 characters of noise (the word past the quick head),
    # shuffled: the answers must stay at their messages' places
    burst = TEXTS + [f"crashed: RuntimeError: {'x' * 300} {text}" for text in TEXTS]
    burst += ["crashed: ValueError: bad label at step 3", "", "MPI_Abort: mpi rank 3 exited"]
    rng.shuffle(burst)
    alone = [is_collective_failure(m) for m in burst]
    assert collective_failures(burst) == alone
    assert any(alone) and not all(alone)
    assert collective_failures([]) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_big_burst_alike_but_for_a_rank_number_is_classified_as_each_alone(seed: int) -> None:
    # peers' messages differ by a rank number before or after the word, so the word's place
    # moves with the number's width; a few own crashes and odd ones among them
    rng = random.Random(seed)
    burst = [f"[rank{r}]: {text}" for text in TEXTS for r in rng.sample(range(4096), 40)]
    burst += [f"crashed: {text} (rank {r})" for text in TEXTS for r in range(8, 12)]
    burst += ["crashed: ValueError: bad label at step 3", "", "x" * 190 + "AllReduce", "gloo"]
    rng.shuffle(burst)
    alone = [is_collective_failure(m) for m in burst]
    assert collective_failures(burst) == alone
    marked, left = _mark_same_place(burst)
    assert all(a for a, m in zip(alone, marked, strict=True) if m)  # never marks a wrong one
    assert left == [i for i, m in enumerate(marked) if not m]
    # a burst alike but for its rank numbers is decided by comparing one place
    peers = [f"RuntimeError: Launch kernel failed: AllReduce-op2 (rank {r})" for r in range(99)]
    assert _mark_same_place(["crashed: ValueError: x", *peers]) == ([False] + [True] * 99, [0])


@pytest.mark.parametrize("n", [0, 1, 5, 64, 65, 300])
def test_positions_are_the_indices_holding_a_value(n: int) -> None:
    values = [None if i % 7 == 3 else 20 + (i % 3 == 0) for i in range(300)]
    for value in (None, 20, 21, 99):
        for some in (values[:n], [value] * n):
            assert positions(some, value) == [i for i, v in enumerate(some) if v == value]


def _rows(facts: list[Fact]) -> Rows:
    rows = Rows()
    for f in facts:
        rows.add(f)
    return rows


def nf(rank: int, step: int, time: float) -> Fact:
    return Fact(NONFINITE, rank, step, time, "loss", "")


def test_rows_are_put_in_time_then_rank_order_keeping_a_rank_s_own_order() -> None:
    facts = [nf(5, 21, T0 + 2), nf(3, 21, T0 + 2), nf(9, 20, T0 + 1), nf(3, 22, T0 + 2)]
    rows = _rows(facts)
    rows.sort()
    assert rows.facts() == [facts[2], facts[1], facts[3], facts[0]]
    ordered = _rows(rows.facts())
    ordered.sort()  # already in order: unchanged
    assert ordered.facts() == rows.facts()


def test_a_column_keeps_a_rank_once_with_its_earliest_step_within_its_room() -> None:
    column = Column(NONFINITE, "loss")
    assert column.add(_rows([nf(1, 21, T0 + 1), nf(2, 21, T0 + 1)]), 10) == (2, 0)
    # rank 2 again at an earlier step, rank 4 new: one at a time
    assert column.add(_rows([nf(2, 20, T0 + 3), nf(4, 22, T0 + 4), nf(1, 23, T0 + 5)]), 8) == (
        1, 0,
    )  # fmt: skip
    assert column.get(2) == nf(2, 20, T0 + 3) and column.get(1) == nf(1, 21, T0 + 1)
    assert (column.min_step(), column.ranks_at(21), column.earliest()) == (
        20, [1], nf(1, 21, T0 + 1),
    )  # fmt: skip
    assert column.add(_rows([nf(r, 30, T0 + 9) for r in range(10, 15)]), 2) == (2, 3)
    assert sorted(column.at) == [1, 2, 4, 10, 11] and len(column) == 5
    held = column.get(10)
    assert held is not None and column.holds(held) and not column.holds(nf(10, 29, T0 + 9))


def test_the_usual_spellings_looked_for_first_are_collective_words() -> None:
    # found as they are, they must say what the lower-case search says
    assert all(form.lower() in COLLECTIVE_WORDS for form in _FORMS)
