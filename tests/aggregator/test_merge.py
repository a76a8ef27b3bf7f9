"""StepMerger: completion, grace, late values, memory bounds."""

from __future__ import annotations

import math

import pytest
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.merge import StepMerger, StepValues


def rec(rank: int, step: int, world: int = 4, run: str = "r", **metrics: float) -> StepRecord:
    return StepRecord(run, rank, step, 0.0, world, "h", 1, step, None, metrics or {"loss": 1.0})


# --- StepMerger ----------------------------------------------------------------------------


def test_group_is_returned_when_every_rank_reported() -> None:
    m = StepMerger()
    assert m.add(rec(0, 1, loss=1.0), 0.0) == []
    assert m.add(rec(1, 1, loss=2.0), 0.1) == []
    assert m.add(rec(2, 1, loss=3.0), 0.2) == []
    out = m.add(rec(3, 1, loss=4.0), 0.3)
    assert out == [StepValues("r", "loss", 1, {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, 4, True)]
    assert m.open_groups() == 1  # kept until grace to catch late values
    assert m.expire(10.0) == []  # nothing partial left
    assert m.open_groups() == 0


def test_each_metric_completes_on_its_own() -> None:
    m = StepMerger()
    m.add(rec(0, 5, world=2, loss=1.0, lr=0.1), 0.0)
    out = m.add(rec(1, 5, world=2, loss=1.5), 0.0)
    assert [(sv.metric, sv.complete) for sv in out] == [("loss", True)]
    out = m.add(rec(1, 5, world=2, lr=0.1), 0.0)  # a second log() call for the same step
    assert [(sv.metric, sv.values) for sv in out] == [("lr", {0: 0.1, 1: 0.1})]


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (4.9, []),
        (5.0, [("loss", 7, {0: 1.0, 2: 3.0}, False)]),
        (60.0, [("loss", 7, {0: 1.0, 2: 3.0}, False)]),
    ],
)
def test_partial_groups_expire_after_grace(now: float, expected: list) -> None:
    m = StepMerger(grace_s=5.0)
    m.add(rec(0, 7, loss=1.0), 0.0)
    m.add(rec(2, 7, loss=3.0), 1.0)
    got = [(sv.metric, sv.step, sv.values, sv.complete) for sv in m.expire(now)]
    assert got == expected


def test_expire_with_a_rank_budget_hands_out_the_oldest_steps_first_and_the_rest_next() -> None:
    m = StepMerger(grace_s=5.0)
    for step in range(1, 6):  # five partial steps of a 4-rank world, two metrics each
        m.add(rec(0, step, loss=1.0, acc=0.5), float(step))
    m.add(rec(0, 1, run="other", world=2), 0.5)  # another run's, past grace too

    def steps(out: list[StepValues]) -> list[tuple[str, int, str]]:
        return [(sv.run, sv.step, sv.metric) for sv in out]

    assert steps(m.expire(100.0, ranks=8)) == [  # two steps of 4 ranks: 8, every metric
        ("r", 1, "loss"), ("r", 1, "acc"), ("r", 2, "loss"), ("r", 2, "acc"),
    ]  # fmt: skip
    assert steps(m.expire(100.0, ranks=1)) == [("r", 3, "loss"), ("r", 3, "acc")]  # one at least
    assert steps(m.expire(100.0)) == [  # no budget: all that is left, run by run
        ("r", 4, "loss"), ("r", 4, "acc"), ("r", 5, "loss"), ("r", 5, "acc"),
        ("other", 1, "loss"),
    ]  # fmt: skip
    assert m.open_groups() == 0 and m.expire(200.0, ranks=8) == []
    assert m.late == 0


def test_a_rank_budget_never_holds_back_steps_evicted_for_the_memory_bound() -> None:
    m = StepMerger(grace_s=5.0, max_open_steps=2)
    for step in range(1, 6):  # steps 1-3 evicted as 4 and 5 open
        m.add(rec(0, step), 0.0)
    got = [sv.step for sv in m.expire(100.0, ranks=1)]
    assert got == [1, 2, 3, 4]  # the evicted, then one past grace
    assert [sv.step for sv in m.expire(100.0, ranks=1)] == [5]


def test_late_values_are_counted_not_scored() -> None:
    m = StepMerger(grace_s=5.0)
    m.add(rec(0, 1, world=2), 0.0)
    m.expire(6.0)  # step 1 handed out partial
    assert m.add(rec(1, 1, world=2, loss=2.0, acc=0.5), 7.0) == []
    assert m.late == 2
    m.add(rec(0, 2, world=2), 7.0)
    m.add(rec(1, 2, world=2), 7.0)
    assert m.add(rec(1, 2, world=2), 7.1) == []  # resent after completion
    assert m.late == 3


def test_nonfinite_values_pass_through() -> None:
    m = StepMerger()
    m.add(rec(0, 1, world=2, loss=math.nan), 0.0)
    (sv,) = m.add(rec(1, 1, world=2, loss=math.inf), 0.0)
    assert math.isnan(sv.values[0]) and sv.values[1] == math.inf


def test_out_of_range_ranks_never_make_a_group_complete() -> None:
    m = StepMerger()
    m.add(rec(0, 1, world=2), 0.0)
    (sv,) = m.add(rec(5, 1, world=2), 0.0)  # rank 5 in a world of 2: misconfigured launcher
    assert not sv.complete


def test_memory_is_bounded_by_the_step_window() -> None:
    m = StepMerger(grace_s=1e9, max_step_window=100)
    for step in range(1, 1_001):  # rank 1 is dead: nothing ever completes
        m.add(rec(0, step, world=2), float(step))
    assert m.open_groups() <= 101
    evicted = m.expire(1_001.0)
    assert len(evicted) == m.evicted == 1_000 - m.open_groups()
    assert all(not sv.complete for sv in evicted)


def test_complete_steps_retired_by_the_window_are_not_counted_as_evicted() -> None:
    """A fast job passes the step window within the grace time: its complete steps leave the
    window, which loses nothing; only steps closed with ranks missing count as evicted."""
    m = StepMerger(grace_s=1e9, max_step_window=100)
    for step in range(1, 1_001):
        m.add(rec(0, step, world=2), 0.0)
        if step % 10:  # rank 1 misses every tenth step
            m.add(rec(1, step, world=2), 0.0)
    assert m.open_groups() <= 101
    assert m.evicted == len(m.expire(0.0)) == 89  # steps 10 .. 890 left with rank 1 missing
    assert m.late == 0


def test_memory_is_bounded_by_open_steps() -> None:
    m = StepMerger(grace_s=1e9, max_open_steps=10, max_step_window=10**9)
    for step in range(0, 1_000_000, 10_000):
        m.add(rec(0, step, world=2), 0.0)
    assert m.open_groups() == 10


def test_runs_are_independent_and_forget_drops_one() -> None:
    m = StepMerger()
    m.add(rec(0, 1, world=2, run="a"), 0.0)
    m.add(rec(0, 1, world=2, run="b"), 0.0)
    (sv,) = m.add(rec(1, 1, world=2, run="b"), 0.0)
    assert sv.run == "b"
    m.forget("a")
    assert m.open_groups() == 1


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="grace_s"):
        StepMerger(grace_s=-1)
