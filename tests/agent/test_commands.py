"""Commands from the aggregator: the wire form, the rank's state machine, and a real socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.commands import DUE_MAX, Commands
from rankwatch.agent.wire import records
from rankwatch.agent.wire.commands import (
    ACK_EVENT,
    COMMAND_VERSION,
    Ack,
    Command,
    CommandError,
    parse_accept,
)

RUN = "cmd-run"


def wire(kind: str = "stop", ident: str = "c1", step: int | None = 10, **extra: Any) -> dict:
    cmd = Command(ident, kind, RUN, 0, None if kind == "note" else step, by="test")
    return {**cmd.to_wire(), **extra}


def make(accept: tuple[str, ...] = ("checkpoint", "stop", "note")) -> tuple[Commands, list[Ack]]:
    acks: list[Ack] = []
    return Commands(RUN, 0, 7, frozenset(accept), acks.append), acks


# --- wire -------------------------------------------------------------------------------


def test_a_command_round_trips_and_is_bounded() -> None:
    cmd = Command("a-1", "checkpoint", RUN, 3, 42, by="policy:nan", inc=9)
    assert Command.from_wire(cmd.to_wire()) == cmd
    assert cmd.to_wire()["cv"] == COMMAND_VERSION
    for bad, reason in [
        ({"cmd": "reboot"}, "kind"),
        ({"id": "x" * 33}, "field"),
        ({"id": "a b"}, "field"),
        ({"step": None}, "field"),
        ({"step": -1}, "field"),
        ({"step": True}, "field"),
        ({"rank": "0"}, "field"),
        ({"text": "x" * 501}, "field"),
        ({"cv": COMMAND_VERSION + 1}, "version"),
        ({"cv": None}, "field"),
    ]:
        with pytest.raises(CommandError) as err:
            Command.from_wire({**cmd.to_wire(), **bad})
        assert err.value.reason == reason, bad
    with pytest.raises(CommandError, match="upgrade rankwatch on the ranks"):
        Command.from_wire({**cmd.to_wire(), "cv": 2})


def test_accept_parses_lists_strings_and_refuses_unknown_kinds() -> None:
    assert parse_accept(None) == frozenset()
    assert parse_accept("") == parse_accept("none") == frozenset()
    assert parse_accept("checkpoint, STOP") == {"checkpoint", "stop"}
    assert parse_accept(("stop",)) == {"stop"}
    assert parse_accept("all") == {"checkpoint", "stop", "note"}
    with pytest.raises(ValueError, match=r"unknown command kind.*reboot"):
        parse_accept("stop,reboot")


def test_an_ack_is_an_event_the_schema_takes() -> None:
    ack = Ack("c1", "stop", "done", 11, 10, "stopping after step 11")
    assert Ack.from_info(ack.info()) == ack
    raw = {"kind": "event", "run": RUN, "rank": 0, "seq": 1, "time": 1.0, "world_size": 1,
           "host": "h", "pid": 1, "event": ACK_EVENT, "step": 11, "info": ack.info()}  # fmt: skip
    rec = records.decode_record(raw)
    assert isinstance(rec, records.EventRecord) and rec.event == ACK_EVENT
    with pytest.raises(CommandError):
        Ack.from_info({**ack.info(), "state": "exploded"})


# --- the rank's state machine -------------------------------------------------------------


def test_stop_at_the_agreed_step_then_stays_stopped() -> None:
    cmds, acks = make()
    cmds.receive(wire("stop", step=10), last_step=8)
    assert [a.state for a in acks] == ["received"] and acks[0].at == 10
    assert not cmds.poll(8) and not cmds.poll(9)
    assert cmds.poll(10) and cmds.stop_step == 10
    assert cmds.poll(11)  # a loop that goes on is told again
    assert [a.state for a in acks] == ["received", "done"]
    assert acks[-1].detail == "stopping after step 10"


def test_checkpoint_runs_before_the_stop_of_the_same_step() -> None:
    cmds, acks = make()
    order: list[str] = []
    cmds.on("checkpoint", lambda step: order.append(f"ckpt{step}") or f"/ck/{step}")
    cmds.on("stop", lambda step: order.append(f"stop{step}"))
    cmds.receive(wire("stop", "s", step=5), last_step=1)
    cmds.receive(wire("checkpoint", "c", step=5), last_step=1)
    assert cmds.poll(5)
    assert order == ["ckpt5", "stop5"]
    done = [a for a in acks if a.state == "done"]
    assert [(a.id, a.detail) for a in done] == [
        ("c", "saved /ck/5"),
        ("s", "stopping after step 5"),
    ]


def test_a_failing_checkpoint_is_told_not_raised() -> None:
    cmds, acks = make()

    def broken(step: int) -> None:
        raise OSError("disk full")

    cmds.on("checkpoint", broken)
    cmds.receive(wire("checkpoint", step=2), last_step=0)
    assert not cmds.poll(2)
    assert acks[-1].state == "failed" and "disk full" in acks[-1].detail
    assert cmds.counts["failed"] == 1


def test_a_command_not_opted_into_is_refused_and_counted() -> None:
    cmds, acks = make(accept=("checkpoint",))
    cmds.on("checkpoint", lambda step: None)
    cmds.receive(wire("stop", step=3), last_step=0)
    assert acks[-1].state == "refused" and "did not opt into 'stop'" in acks[-1].detail
    assert not cmds.poll(100) and cmds.counts["refused"] == 1
    nothing, acks2 = make(accept=())
    nothing.receive(wire("checkpoint", step=3), last_step=0)
    assert acks2[-1].state == "refused" and "accepts: none" in acks2[-1].detail


def test_checkpoint_without_a_handler_is_refused() -> None:
    cmds, acks = make()
    cmds.receive(wire("checkpoint", step=3), last_step=0)
    assert acks[-1].state == "refused" and "no checkpoint handler" in acks[-1].detail


def test_a_replayed_id_acts_once() -> None:
    cmds, acks = make()
    saved: list[int] = []
    cmds.on("checkpoint", saved.append)
    cmds.receive(wire("checkpoint", "same", step=4), last_step=0)
    cmds.receive(wire("checkpoint", "same", step=4), last_step=1)
    cmds.poll(4)
    cmds.receive(wire("checkpoint", "same", step=9), last_step=4)
    cmds.poll(9)
    assert saved == [4]
    assert [a.state for a in acks] == ["received", "replayed", "done", "replayed"]
    assert acks[-1].detail == "already done" and cmds.counts["replayed"] == 2


def test_late_command_acts_at_the_next_step_end() -> None:
    cmds, acks = make()
    cmds.receive(wire("stop", step=5), last_step=7)
    assert acks[-1].state == "late" and acks[-1].step == 7
    assert cmds.poll(8)


def test_commands_for_another_rank_or_malformed_are_refused() -> None:
    cmds, acks = make()
    cmds.receive({**wire("stop"), "rank": 3}, last_step=0)
    assert acks[-1].state == "refused" and "meant for run" in acks[-1].detail
    cmds.receive({**wire("stop"), "cv": 5}, last_step=0)
    assert acks[-1].state == "refused" and "upgrade" in acks[-1].detail
    cmds.receive({"cmd": "stop", "cv": 1, "id": "bad id"}, last_step=0)  # nothing to answer to
    cmds.receive({**wire("stop"), "inc": 99}, last_step=0)  # an earlier process's: silent
    assert len(acks) == 2 and cmds.counts["refused"] == 3
    assert not cmds.poll(1000)


def test_note_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    cmds, acks = make()
    got: list[str] = []
    cmds.on("note", got.append)
    cmds.receive({**wire("note"), "text": "look at rank 2"}, last_step=3)
    assert got == ["look at rank 2"] and acks[-1].state == "done"
    assert "look at rank 2" in caplog.text


def test_due_commands_are_bounded() -> None:
    cmds, acks = make()
    for i in range(DUE_MAX + 1):
        cmds.receive(wire("stop", f"id{i}", step=100 + i), last_step=0)
    assert acks[-1].state == "refused" and "already wait" in acks[-1].detail


def test_on_refuses_unknown_kinds() -> None:
    cmds, _ = make()
    with pytest.raises(ValueError, match="commands are"):
        cmds.on("reboot", print)


# --- a Monitor over a real socket ------------------------------------------------------------


def acks_of(recs: list[records.Record]) -> list[dict[str, Any]]:
    events = [r for r in recs if isinstance(r, records.EventRecord)]
    return [dict(r.info) for r in events if r.event == "command"]


def test_monitor_takes_a_command_over_zeromq(
    router: Any, make_monitor: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RANKWATCH_ACCEPT", "checkpoint,stop")
    mon = make_monitor(run=RUN, rank=0, world_size=1, addr=router.addr)
    saved: list[int] = []
    mon.on("checkpoint", lambda step: saved.append(step) or f"ck{step}")
    mon.log(1, loss=1.0)
    recs = router.wait_for(lambda recs: any(isinstance(r, records.StepRecord) for r in recs))
    start = next(r for r in recs if isinstance(r, records.EventRecord) and r.event == "start")
    assert start.info["accept"] == ["checkpoint", "stop"]
    peer = next(iter(router.peers))
    router.send(peer, Command("k1", "checkpoint", RUN, 0, 3, by="test").to_wire())
    router.send(peer, Command("s1", "stop", RUN, 0, 3, by="test").to_wire())
    router.send(peer, Command("n1", "note", RUN, 0, None, text="hi").to_wire())
    router.wait_for(lambda recs: len(acks_of(recs)) >= 3)
    states = {a["id"]: a["state"] for a in acks_of(router.received)}
    assert states == {"k1": "received", "s1": "received", "n1": "refused"}
    stopped_at = None
    for step in range(2, 10):
        mon.log(step, loss=1.0)
        if mon.should_stop(step):
            stopped_at = step
            break
    assert stopped_at == 3 and saved == [3]
    router.wait_for(lambda recs: sum(a["state"] == "done" for a in acks_of(recs)) == 2)
    mon.close()
    on_disk = [records.from_json_line(line) for line in mon.jsonl_path.read_text().splitlines()]
    assert len(acks_of(on_disk)) == 5  # in the JSONL too: an import or a resend carries them


def test_monitor_accept_argument_is_checked(make_monitor: Any) -> None:
    with pytest.raises(ValueError, match="unknown command kind"):
        make_monitor(accept=("explode",))
    mon = make_monitor()
    assert mon.commands is not None and mon.commands.accept == frozenset()
    assert not mon.should_stop()


# --- held: act only on the aggregator's word ------------------------------------------------


def held(kind: str = "stop", step: int = 5) -> dict:
    return Command("h1", kind, RUN, 0, step, by="test", hold=True).to_wire()


def word(kind: str, step: int = 5, text: str = "") -> dict:
    return Command("h1", kind, RUN, 0, step, text=text).to_wire()


def test_a_held_stop_waits_for_go_at_its_step() -> None:
    import threading

    cmds, acks = make()
    cmds.receive(held(), last_step=2)
    assert not cmds.poll(4)  # before the step: no wait
    threading.Timer(0.2, lambda: cmds.receive(word("go"), last_step=5)).start()
    assert cmds.poll(5)  # waited for the go, then stopped
    assert [a.state for a in acks] == ["received", "done"]


def test_move_and_abort() -> None:
    cmds, acks = make()
    cmds.receive(held(), last_step=2)
    cmds.receive(word("move", 9), last_step=3)
    assert acks[-1].state == "received" and acks[-1].at == 9
    assert not cmds.poll(5) and cmds.next_at == 9
    cmds.receive(word("go", 9), last_step=6)
    assert cmds.poll(9)
    other, acks2 = make()
    other.receive(held(), last_step=2)
    other.receive(word("abort", text="rank 3 refused"), last_step=3)
    assert acks2[-1].state == "aborted" and acks2[-1].detail == "rank 3 refused"
    assert not other.poll(5) and other.next_at is None
    other.receive(word("go"), last_step=5)  # a word for what is gone: nothing
    assert not other.poll(6)


def test_no_word_in_time_means_no_action(monkeypatch: pytest.MonkeyPatch) -> None:
    from rankwatch.agent.wire import commands as wire_commands

    monkeypatch.setattr(wire_commands, "HOLD_MAX_S", 0.2)
    cmds, acks = make()
    cmds.receive(held(), last_step=2)
    assert not cmds.poll(5)
    assert acks[-1].state == "failed" and "so no rank leaves alone" in acks[-1].detail
