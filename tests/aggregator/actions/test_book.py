"""The command state machine, table-driven, with ``now`` passed in (never sleeps)."""

from __future__ import annotations

import pytest
from rankwatch.agent.wire.commands import Ack, CommandError
from rankwatch.aggregator.actions.book import ACK_TIMEOUT_S, MAX_SENDS, RETRY_S, CommandBook

RUN = "r"


def ack(ident: str, state: str, step: int = 5, detail: str = "") -> dict:
    return Ack(ident, "stop", state, step, 7, detail).info()


def issued(book: CommandBook, ranks: tuple[int, ...] = (0, 1), now: float = 100.0):
    return book.issue("c1", RUN, "stop", ranks, 7, now=now, by="test", incs={0: 5})


def test_sends_then_retries_then_gives_up() -> None:
    book = CommandBook()
    cmd = issued(book)
    assert [(c.id, r) for c, r in book.sends(100.0)] == [("c1", 0), ("c1", 1)]
    book.sent(cmd, 0, 100.0, ok=True)
    book.sent(cmd, 1, 100.0, ok=False)  # no route yet
    assert cmd.answers[0].state == "sent" and cmd.answers[1].state == "pending"
    assert book.sends(100.0 + RETRY_S / 2) == []
    assert len(book.sends(100.0 + RETRY_S)) == 2
    assert book.n["commands_send_failed"] == 1
    assert cmd.message(0)["inc"] == 5 and "inc" not in cmd.message(1)
    for i in range(1, MAX_SENDS + 2):
        for c, r in book.sends(100.0 + i * RETRY_S):
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
