"""The action desk: who a command goes to, its step, and what it refuses (pure, no sockets)."""

from __future__ import annotations

import pytest
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.actions.desk import ActionDesk, ActionError
from rankwatch.aggregator.health import RankHealth, RankState


def health(rank: int, state: RankState = RankState.ALIVE, last: int = 10) -> RankHealth:
    return RankHealth("r", rank, state, "h", 1, 3, last, 0.0, 0.0, "", 0, 1.0)


HEALTH = {"r": {0: health(0), 1: health(1), 2: health(2, RankState.FINISHED)}}


def no_inc(run: str, rank: int) -> int:
    return 0


def test_a_stop_goes_to_the_live_ranks_ahead_of_the_newest_step() -> None:
    desk = ActionDesk()
    desk.steps([StepRecord("r", 0, 1, 0.0, 3, "h", 1, 15, None, {})])  # health lags behind
    cmd = desk.issue("r", "stop", HEALTH, 0.0, no_inc, by="t")
    assert cmd.ranks == (0, 1) and cmd.step == 17
    sent: list[tuple[str, int, dict]] = []
    desk.tick(0.0, HEALTH, lambda run, rank, m: sent.append((run, rank, m)) or True, no_inc)
    assert [(r, m["cmd"], m["step"]) for _, r, m in sent] == [(0, "stop", 17), (1, "stop", 17)]
    desk.started("r")  # a new start: the count may begin again
    assert desk.issue("r", "stop", HEALTH, 0.0, no_inc, by="t").step == 12


@pytest.mark.parametrize(
    ("run", "kind", "ranks", "words"),
    [
        ("nope", "stop", None, "no live run 'nope'"),
        ("r", "stop", [7], "no rank 7"),
        ("r", "stop", [2], "rank 2 of run 'r' is not live"),
        ("r", "reboot", None, "unknown command 'reboot'"),
    ],
)
def test_bad_requests_are_refused(run: str, kind: str, ranks: list[int] | None, words: str) -> None:
    with pytest.raises(ActionError, match=words):
        ActionDesk().issue(run, kind, HEALTH, 0.0, no_inc, by="t", ranks=ranks)


def test_nothing_live_is_refused() -> None:
    over = {"r": {0: health(0, RankState.CRASHED)}}
    with pytest.raises(ActionError, match="no rank of run 'r' is live"):
        ActionDesk().issue("r", "stop", over, 0.0, no_inc, by="t")
