"""The rules of one rank: the usual rank's shortcut (``usual_alive``) says what ``state_of``
says, and a step moves a rank on (``advance``)."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.health.rules import (
    RankFacts,
    RankState,
    advance,
    limits,
    state_of,
    usual_alive,
)

LOST_S, MIN_STALL_S, FACTOR = 10.0, 30.0, 10.0


def facts(**kw: object) -> RankFacts:
    r = RankFacts(0.0)
    for name, value in kw.items():
        setattr(r, name, value)
    return r


# (facts, judged, the state at judged)
USUAL = [
    (facts(), 5.0, RankState.ALIVE),  # no step yet: never stalled
    (facts(), 10.5, RankState.LOST),
    (facts(next_in=20.0), 40.0, RankState.ALIVE),  # announced a long silence: 2 x 20 + 2
    (facts(next_in=20.0), 42.5, RankState.LOST),
    (facts(last_step=3, last_seen=25.0), 29.0, RankState.ALIVE),
    (facts(last_step=3, last_seen=25.0), 31.0, RankState.STALLED),  # heard, step put
    (facts(last_step=3, last_seen=45.0, step_time=4.0), 39.0, RankState.ALIVE),  # 10 x 4 s
    (facts(last_step=3, last_seen=45.0, step_time=4.0), 41.0, RankState.STALLED),
    (facts(last_step=3, last_seen=-1.0, last_progress=-40.0), -5.0, RankState.ALIVE),
]


@pytest.mark.parametrize(("r", "judged", "want"), USUAL)
def test_usual_alive_says_what_state_of_says(r: RankFacts, judged: float, want: RankState) -> None:
    state, _, _ = state_of(r, judged, judged, LOST_S, MIN_STALL_S, FACTOR)
    assert state is want
    assert usual_alive(r, judged, LOST_S, MIN_STALL_S, FACTOR) is (want is RankState.ALIVE)


@pytest.mark.parametrize(
    ("next_in", "step_time", "want"),
    [(None, None, (10.0, 30.0)), (1.0, 1.0, (10.0, 30.0)), (20.0, 5.0, (42.0, 50.0))],
)
def test_limits(next_in: float | None, step_time: float | None, want: tuple[float, float]) -> None:
    assert limits(facts(next_in=next_in, step_time=step_time), 10.0, 30.0, 10.0) == want


# (last step, its rank time, step time, new step, its rank time, logged) -> step, step time
ADVANCE = [
    ((None, None, None), (1, 10.0, None), (1, None)),  # a first step teaches nothing
    ((None, None, None), (1, 10.0, 2.0), (1, 2.0)),  # but the step_time it logged
    ((1, 10.0, None), (3, 14.0, 9.0), (3, 2.0)),  # measured on the rank's clock: 4 s / 2
    ((1, 10.0, 2.0), (2, 14.0, None), (2, 2.4)),  # EWMA: 2 + 0.2 x (4 - 2)
    ((1, 10.0, 2.0), (2, 9.0, None), (2, 2.0)),  # the rank's clock went back: not learnt
    ((5, 10.0, 2.0), (5, 20.0, None), (5, 2.0)),  # not newer: nothing moves
    ((1, None, None), (2, 20.0, 3.0), (2, 3.0)),  # after a heartbeat's step: what it logged
]


@pytest.mark.parametrize(("before", "record", "after"), ADVANCE)
def test_advance(
    before: tuple[int | None, float | None, float | None],
    record: tuple[int, float, float | None],
    after: tuple[int, float | None],
) -> None:
    r = facts(last_step=before[0], prev_step_time=before[1], step_time=before[2])
    advance(r, *record[:2], 50.0, record[2])
    assert r.last_step == after[0] and r.step_time == pytest.approx(after[1])
    moved = record[0] > (before[0] or 0)
    assert r.last_progress == (50.0 if moved else 0.0)
