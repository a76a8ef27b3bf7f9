"""The command state machine, table-driven, with ``now`` passed in (never sleeps)."""

from __future__ import annotations

import pytest
from rankwatch.agent.wire.commands import Ack, CommandError
from rankwatch.aggregator.actions.book import (
    ACK_TIMEOUT_S,
    ASK_TIMEOUT_S,
    MAX_MOVES,
    MAX_SENDS,
    RETRY_S,
    CommandBook,
)

RUN = "r"


def ack(ident: str, state: str, step: int = 5, detail: str = "") -> dict:
    return Ack(ident, "stop", state, step, 7, detail).info()


def issued(book: CommandBook, ranks: tuple[int, ...] = (0, 1), now: float = 100.0):
    return book.issue("c1", RUN, "stop", ranks, 7, now=now, by="test", incs={0: 5})


def test_sends_then_retries_then_gives_up() -> None:
    book = CommandBook()
    cmd = issued(book)
    assert [(c.id, r) for c, r, _ in book.sends(100.0)] == [("c1", 0), ("c1", 1)]
    book.sent(cmd, 0, 100.0, ok=True)
    book.sent(cmd, 1, 100.0, ok=False)  # no route yet
    assert cmd.answers[0].state == "sent" and cmd.answers[1].state == "pending"
    assert book.sends(100.0 + RETRY_S / 2) == []
    assert len(book.sends(100.0 + RETRY_S)) == 2
    assert book.n["commands_send_failed"] == 1
    assert cmd.message(0)["inc"] == 5 and "inc" not in cmd.message(1)
    for i in range(1, MAX_SENDS + 2):
        for c, r, _ in book.sends(100.0 + i * RETRY_S):
            book.sent(c, r, 100.0 + i * RETRY_S, ok=True)
    assert cmd.answers[0].sends == MAX_SENDS


@pytest.mark.parametrize(
    ("answers", "rank0", "state"),
    [
        (["received", "done"], "done", "waiting"),  # rank 1 still waits
        (["refused"], "refused", "waiting"),
        (["late", "done"], "done", "waiting"),
        (["done", "received"], "done", "waiting"),  # an earlier answer after a later one
        (["replayed"], "received", "waiting"),
        (["done", "replayed"], "done", "waiting"),
    ],
)
def test_answers_move_a_rank(answers: list[str], rank0: str, state: str) -> None:
    book = CommandBook()
    cmd = issued(book)
    for a in answers:
        book.answer(RUN, 0, ack("c1", a), 101.0)
    assert cmd.answers[0].state == rank0 and cmd.state == state


def test_command_state_summarises_the_ranks() -> None:
    book = CommandBook()
    cmd = issued(book)
    for rank in (0, 1):
        book.answer(RUN, rank, ack("c1", "done"), 101.0)
    assert cmd.state == "done" and cmd.counts() == {"done": 2}
    other = book.issue("c2", RUN, "stop", (0, 1), 7, now=100.0, by="t")
    book.answer(RUN, 0, ack("c2", "refused"), 101.0)
    assert other.state == "waiting"
    book.expire(100.0 + ACK_TIMEOUT_S)
    assert other.state == "incomplete" and other.answers[1].state == "no_ack"
    assert "no answer" in other.answers[1].detail


def test_unknown_ids_ranks_runs_and_bad_acks_are_counted_not_applied() -> None:
    book = CommandBook()
    cmd = issued(book)
    assert book.answer(RUN, 0, ack("nope", "done"), 101.0) is None
    assert book.answer(RUN, 9, ack("c1", "done"), 101.0) is None  # not one of its ranks
    assert book.answer("other", 0, ack("c1", "done"), 101.0) is None
    assert book.answer(RUN, 0, {"id": "c1", "state": "exploded"}, 101.0) is None
    assert book.n["command_acks_unknown"] == 3 and book.n["command_acks_bad"] == 1
    assert cmd.answers[0].state == "pending"


def test_no_ack_then_a_late_answer_still_counts() -> None:
    book = CommandBook()
    cmd = issued(book, ranks=(0,))
    assert book.expire(100.0 + ACK_TIMEOUT_S - 0.1) == []
    assert book.expire(100.0 + ACK_TIMEOUT_S) == [cmd]
    assert book.sends(100.0 + ACK_TIMEOUT_S + RETRY_S) == []  # no more sends after it
    book.answer(RUN, 0, ack("c1", "done"), 120.0)
    assert cmd.answers[0].state == "done" and book.n["command_acks_after_timeout"] == 1


def test_an_id_is_issued_once_and_bad_commands_are_refused() -> None:
    book = CommandBook()
    issued(book)
    with pytest.raises(CommandError, match="already issued"):
        issued(book)
    with pytest.raises(CommandError):
        book.issue("c3", RUN, "stop", (0,), None, now=1.0, by="t")  # a stop needs a step
    with pytest.raises(CommandError, match="at least one rank"):
        book.issue("c4", RUN, "stop", (), 3, now=1.0, by="t")


def test_restore_takes_a_stored_command_back() -> None:
    book = CommandBook()
    cmd = issued(book)
    book.answer(RUN, 0, ack("c1", "received"), 101.0)
    again = CommandBook()
    again.restore(cmd.as_dict())
    again.restore({"id": "broken"})  # ignored
    again.answer(RUN, 0, ack("c1", "done"), 130.0)
    back = again.get("c1")
    assert back is not None and back.answers[0].state == "done"
    assert back.as_dict()["ranks"] == [0, 1]


# --- held commands: every rank at one step, or none -----------------------------------------


def held(book: CommandBook, step: int = 7):
    return book.issue("h1", RUN, "stop", (0, 1), step, now=100.0, by="t", hold=True, margin=3)


def words(book: CommandBook, now: float) -> list[tuple[int, str, int | None]]:
    return [(r, m["cmd"], m["step"]) for _, r, m in book.sends(now)]


def answer(book: CommandBook, rank: int, state: str, step: int, at: int, now: float = 101.0):
    return book.answer(RUN, rank, Ack("h1", "stop", state, step, at).info(), now)


def test_go_once_every_rank_can_reach_the_step() -> None:
    book = CommandBook()
    cmd = held(book)
    assert words(book, 100.0) == [(0, "stop", 7), (1, "stop", 7)]
    assert book.sends(100.0)[0][2]["hold"] is True
    answer(book, 0, "received", 5, 7)
    assert book.decide(101.0) == []  # rank 1 has not answered
    answer(book, 1, "received", 5, 7)
    assert book.decide(101.0) == [cmd] and cmd.phase == "go"
    assert words(book, 101.0) == [(0, "go", 7), (1, "go", 7)]
    for rank in (0, 1):
        answer(book, rank, "done", 7, 7)
    assert cmd.state == "done" and words(book, 110.0) == []


def test_a_rank_past_the_step_moves_it_for_all() -> None:
    book = CommandBook()
    cmd = held(book)
    answer(book, 0, "received", 6, 7)
    answer(book, 1, "late", 8, 7)
    book.decide(101.0)
    assert (cmd.step, cmd.phase, cmd.moves) == (8 + 3, "ask", 1)
    assert words(book, 101.0) == [(0, "move", 11), (1, "move", 11)]
    answer(book, 0, "received", 7, 7)  # about the old step: ignored
    assert cmd.answers[0].state == "sent"
    answer(book, 0, "received", 8, 11)
    answer(book, 1, "received", 9, 11)
    book.decide(102.0)
    assert cmd.phase == "go" and words(book, 102.0) == [(0, "go", 11), (1, "go", 11)]


def test_a_refusal_or_silence_aborts_it_for_all() -> None:
    book = CommandBook()
    cmd = held(book)
    answer(book, 0, "received", 5, 7)
    answer(book, 1, "refused", 5, 7)
    book.decide(101.0)
    assert cmd.phase == "abort" and words(book, 101.0) == [(0, "abort", 7)]
    assert "aborted for every rank" in book.sends(101.0)[0][2]["text"]
    answer(book, 0, "aborted", 6, 7)
    assert cmd.state == "aborted" and book.n["commands_aborted"] == 1

    quiet = CommandBook()
    cmd = held(quiet)
    answer(quiet, 0, "received", 5, 7)
    assert quiet.decide(100.0 + ASK_TIMEOUT_S - 0.1) == []
    quiet.decide(100.0 + ASK_TIMEOUT_S)
    assert cmd.answers[1].state == "no_ack" and cmd.phase == "abort"
    answer(quiet, 1, "received", 5, 7, now=105.0)  # it answers after all: told to abort too
    assert [w for _, w, _ in words(quiet, 105.0)] == ["abort", "abort"]


def test_ranks_that_keep_passing_it_end_in_an_abort() -> None:
    book = CommandBook()
    cmd = held(book)
    for move in range(MAX_MOVES + 1):
        for rank in (0, 1):
            answer(book, rank, "late", cmd.step + 1, cmd.step)
        book.decide(101.0 + move)
    assert cmd.phase == "abort" and cmd.moves == MAX_MOVES


def test_a_rank_that_goes_past_the_step_without_acting_has_failed() -> None:
    """Told go, it reports steps well past the step and never says done (a loop that does not
    call should_stop): the command settles as incomplete instead of waiting for ever; one step
    past is still in time (the answer may be on its way)."""
    book = CommandBook()
    cmd = book.issue("c1", RUN, "stop", (0, 1), 7, now=100.0, by="test", hold=True)
    for rank in (0, 1):
        book.answer(RUN, rank, ack("c1", "received"), 101.0)
    assert book.passed(101.0, lambda run, rank: 20) == []  # not told go yet: it waits at 7
    (decided,) = book.decide(101.0)
    assert decided.phase == "go"
    steps = {0: 8, 1: 7}
    assert book.passed(102.0, lambda run, rank: steps[rank]) == []
    book.answer(RUN, 1, ack("c1", "done", 7), 102.5)
    steps[0] = 9
    assert book.passed(103.0, lambda run, rank: steps[rank]) == [cmd]
    assert cmd.answers[0].state == "failed" and "without acting at step 7" in cmd.answers[0].detail
    assert cmd.answers[1].state == "done" and cmd.state == "incomplete"
    assert book.n["command_not_acted"] == 1
    assert book.passed(104.0, lambda run, rank: 50) == []  # told once
