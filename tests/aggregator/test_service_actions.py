"""Commands through the wired aggregator: a policy that stops a NaN run, and the channel over
real ZeroMQ sockets with real agents (one opted in, one not, one that never answers); the
commands and their answers in the store, the API, after a restart."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from fastapi.testclient import TestClient
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.aggregator.actions import book as book_module
from rankwatch.aggregator.actions.desk import ActionError
from rankwatch.aggregator.actions.policy import parse_spec
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.dashboard.app import create_app

from .test_service_incidents import RUN, WORLD, feed_nan_spread

BASE_URL = "http://127.0.0.1"


def config(tmp_path: Path, policy: str | None = None, **kw: Any) -> ServeConfig:
    rules = parse_spec(policy) if policy else ()
    return ServeConfig(data_dir=tmp_path / "data", console_alerts=False, policies=rules, **kw)


def test_stop_on_nan_sends_every_rank_one_stop_step(tmp_path: Path) -> None:
    agg = Aggregator(config(tmp_path, "stop-on-nan"))
    sub = agg.feed.subscribe()
    feed_nan_spread(agg, fault=20, steps=22)
    cmds = agg.commands_of(RUN)
    assert sorted(c["cmd"] for c in cmds) == ["checkpoint", "stop"]
    (stop,) = [c for c in cmds if c["cmd"] == "stop"]
    (ckpt,) = [c for c in cmds if c["cmd"] == "checkpoint"]
    assert stop["ranks"] == ckpt["ranks"] == list(range(WORLD))
    assert stop["step"] == ckpt["step"] and 21 <= stop["step"] <= 23
    assert stop["by"] == "policy:nonfinite" and "culprit rank 2" in stop["reason"]
    # no receiver (never started): nothing could be sent, nothing pretends it was
    assert all(a["state"] == "pending" for a in stop["acks"].values())
    assert agg.counters()["commands_send_failed"] >= WORLD
    (incident,) = agg.incidents_of(RUN)  # the incident shows what was done about it
    assert {a["cmd"] for a in incident["actions"]} == {"checkpoint", "stop"}
    assert all(c["incident"] == incident["id"] for c in cmds)
    published = [m for m in sub.drain(100_000) if m.get("type") == "command"]
    assert {m["command"]["id"] for m in published} == {stop["id"], ckpt["id"]}
    feed_nan_spread(agg, fault=20, steps=24)  # the same incident does not fire again
    assert len(agg.commands_of(RUN)) == 2
    agg.stop()


def test_without_a_policy_nothing_is_sent(tmp_path: Path) -> None:
    agg = Aggregator(config(tmp_path))
    feed_nan_spread(agg, fault=20, steps=22)
    assert agg.incidents.incidents(RUN) and agg.commands_of(RUN) == []
    agg.stop()


# --- the channel, over real sockets -------------------------------------------------------


class Rank(threading.Thread):
    """A training loop with a real Monitor: steps until told to stop (or ``steps``)."""

    def __init__(self, agg: Aggregator, run: str, rank: int, world: int, accept: str) -> None:
        super().__init__(daemon=True)
        self.mon = Monitor(run=run, rank=rank, world_size=world, accept=accept,
                           addr=f"tcp://127.0.0.1:{agg.ingest_port}",
                           log_dir=agg.config.data_dir / "jsonl")  # fmt: skip
        self.saved: list[int] = []
        self.mon.on("checkpoint", lambda s: self.saved.append(s) or f"ck-{rank}-{s}")
        self.stopped: int | None = None
        self.go = threading.Event()
        self.halt = threading.Event()  # the test is over

    def run(self) -> None:
        for step in range(1, 2000):
            if step > 3:
                self.go.wait(10)
            self.mon.log(step, loss=1.0)
            if self.mon.should_stop(step):
                self.stopped = step
                break
            if self.halt.wait(0.01):
                break
        self.mon.close()


def wait(cond: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_checkpoint_and_stop_over_zeromq_with_a_refusing_rank(tmp_path: Path) -> None:
    run = "chan"
    agg = Aggregator(config(tmp_path, ingest_host="127.0.0.1", ingest_port=0))
    agg.start()
    ranks = [Rank(agg, run, 0, 2, "checkpoint,stop"), Rank(agg, run, 1, 2, "")]
    try:
        for r in ranks:
            r.start()
        wait(
            lambda: (
                len(agg.snapshot(run=run, ranks=False)["runs"]) == 1
                and all(agg.receiver and agg.receiver.identity_of(run, i) for i in (0, 1))
            )
        )
        with pytest.raises(ActionError, match="no rank 5"):
            agg.issue_command(run, "stop", by="test", ranks=[5])
        with pytest.raises(ActionError, match="no live run 'nope'"):
            agg.issue_command("nope", "stop", by="test")

        def states(cid: str) -> dict[str, str]:
            (c,) = [c for c in agg.commands_of(run) if c["id"] == cid]
            return {rank: a["state"] for rank, a in c["acks"].items()}

        # rank 1 did not opt in: a stop of both is aborted for both (in lockstep training a
        # rank leaving alone would leave the other waiting in its collective)
        both = agg.issue_command(run, "stop", by="test", reason="because")
        for r in ranks:
            r.go.set()
        wait(lambda: states(both["id"]) == {"0": "aborted", "1": "refused"})
        (got,) = [c for c in agg.commands_of(run) if c["id"] == both["id"]]
        assert got["state"] == "aborted" and "did not opt into 'stop'" in got["acks"]["1"]["detail"]
        assert "aborted for every rank" in got["reason"] and "(because)" in got["reason"]
        assert ranks[0].stopped is None and ranks[1].stopped is None
        # to rank 0 alone: checkpoint, then stop, at one step
        ckpt = agg.issue_command(run, "checkpoint", by="test", ranks=[0])
        stop = agg.issue_command(run, "stop", by="test", ranks=[0], step=ckpt["step"])
        wait(lambda: ranks[0].stopped is not None)
        assert ranks[0].stopped == stop["step"] and ranks[0].saved == [ckpt["step"]]
        wait(lambda: states(stop["id"]) == {"0": "done"} and states(ckpt["id"]) == {"0": "done"})
        assert ranks[1].stopped is None  # a rank that did not opt in goes on
        (got,) = [c for c in agg.commands_of(run) if c["id"] == ckpt["id"]]
        assert got["acks"]["0"]["detail"] == f"saved ck-0-{ckpt['step']}"
        counters = agg.counters()
        assert counters["command_refused"] == 1 and counters["command_acks_unknown"] == 0
        assert counters["commands_aborted"] == 1
        client = TestClient(create_app(AggregatorProvider(agg)), base_url=BASE_URL)
        body = client.get("/api/run/commands", params={"run": run}).json()
        assert {c["id"] for c in body["commands"]} == {both["id"], ckpt["id"], stop["id"]}
    finally:
        for r in ranks:
            r.halt.set()
            r.go.set()
            r.join(10)
        agg.stop()
    again = Aggregator(config(tmp_path))  # a new serve: the store still has them
    try:
        stored = {c["id"]: c for c in again.commands_of(run)}
        assert stored[stop["id"]]["acks"]["0"]["state"] == "done"
    finally:
        again.stop()


def test_a_rank_that_never_answers_is_no_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent from before commands: it sends records, ignores the command (so do plain
    DEALERs), and the command says so after the timeout; a replayed ack id is counted."""
    monkeypatch.setattr(book_module, "ACK_TIMEOUT_S", 1.0)
    monkeypatch.setattr(book_module, "RETRY_S", 0.2)
    agg = Aggregator(config(tmp_path, ingest_host="127.0.0.1", ingest_port=0))
    agg.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{agg.ingest_port}")
        base = {"run": "old", "rank": 0, "world_size": 1, "host": "h", "pid": 1}
        steps = [{"kind": "step", **base, "seq": s, "time": time.time(), "step": s,
                  "epoch": None, "metrics": {"loss": 1.0}} for s in (1, 2)]  # fmt: skip
        sock.send(records.encode_frame(steps))
        wait(lambda: agg.receiver is not None and agg.receiver.identity_of("old", 0) is not None)
        cmd = agg.issue_command("old", "stop", by="test")
        assert cmd["step"] >= 2 + 2
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:
            if sock.poll(100):
                got.append(msgpack.unpackb(sock.recv()))
        assert len(got) >= 2 and {m["id"] for m in got} == {cmd["id"]}  # retried
        assert math.isclose(got[0]["cv"], 1)
        wait(lambda: agg.commands_of("old")[0]["acks"]["0"]["state"] == "no_ack")
        assert agg.counters()["command_no_ack"] == 1
        # an answer with a made-up id, and the real one after the timeout
        for ident in ("zz-made-up", cmd["id"]):
            ack = {"kind": "event", **base, "seq": 3 + len(ident), "time": time.time(),
                   "event": "command", "step": 2, "info": {"id": ident, "cmd": "stop",
                   "state": "received", "step": 2, "at": cmd["step"], "detail": ""}}  # fmt: skip
            sock.send(records.encode_frame([ack]))
        wait(lambda: agg.commands_of("old")[0]["acks"]["0"]["state"] == "received")
        counters = agg.counters()
        assert counters["command_acks_unknown"] == 1
        assert counters["command_acks_after_timeout"] == 1
    finally:
        sock.close(0)
        ctx.term()
        agg.stop()


def step_at(run: str, rank: int, s: int, t: float) -> records.StepRecord:
    return records.StepRecord(run, rank, s, t, 2, "h", 1, s, None, {"loss": 1.0})


def test_an_answer_after_the_aggregator_restarted_still_lands(tmp_path: Path) -> None:
    """The aggregator dies between a command and its acknowledgement: the next one takes the
    command back from the store and applies the rank's late answer to it."""
    now = time.time()
    first = Aggregator(config(tmp_path, ingest_host="127.0.0.1", ingest_port=0))
    first.start()
    first.add([step_at("r", rank, 5, now) for rank in (0, 1)], imported=False)
    cmd = first.issue_command("r", "stop", by="test")
    first.tick()
    first.stop()  # no rank ever answered this aggregator
    again = Aggregator(config(tmp_path, ingest_host="127.0.0.1", ingest_port=0))
    again.start()
    try:
        ack = {"id": cmd["id"], "cmd": "stop", "state": "done", "step": cmd["step"],
               "at": cmd["step"], "detail": "stopping"}  # fmt: skip
        event = records.EventRecord("r", 0, 6, time.time(), 2, "h", 1, "command", 7, ack)
        again.add([event], imported=False)
        again.tick()
        (got,) = again.commands_of("r")
        assert got["acks"]["0"]["state"] == "done" and got["acks"]["1"]["state"] != "done"
        assert again.counters()["command_acks_unknown"] == 0
    finally:
        again.stop()


def test_commands_in_words() -> None:
    from rankwatch.aggregator.actions.words import command_line, command_lines

    c = {"cmd": "stop", "step": 14, "by": "policy:nonfinite", "created": 0.0,
         "acks": {"0": {"state": "done"}, "1": {"state": "done"},
                  "2": {"state": "refused", "detail": "this rank did not opt into 'stop'"},
                  "3": {"state": "no_ack"}}}  # fmt: skip
    line = command_line(c)
    assert line.startswith("COMMAND stop at step 14 by policy:nonfinite ")
    assert "2 done; no_ack rank 3; refused rank 2 (this rank did not opt into 'stop')" in line
    many = command_lines([{**c, "created": float(i)} for i in range(12)])
    assert len(many) == 11 and many[-1].startswith("... and 2 earlier")


def test_commands_over_http_need_a_token(tmp_path: Path) -> None:
    now = time.time()
    agg = Aggregator(config(tmp_path))
    agg.add([step_at("r", rank, 5, now) for rank in (0, 1)], imported=False)
    try:
        open_app = TestClient(create_app(AggregatorProvider(agg)), base_url=BASE_URL)
        refused = open_app.post("/api/run/commands", params={"run": "r"}, json={"cmd": "stop"})
        assert refused.status_code == 403 and "need a token" in refused.json()["detail"]
        assert agg.commands_of("r") == []
        app = TestClient(create_app(AggregatorProvider(agg), "s3cret"), base_url=BASE_URL)
        auth = {"Authorization": "Bearer s3cret"}
        ok = app.post("/api/run/commands", params={"run": "r"}, headers=auth,
                      json={"cmd": "stop", "reason": "from a test"})  # fmt: skip
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert body["ranks"] == [0, 1] and body["by"].startswith("page (")
        for bad, code in [({"cmd": "stop", "ranks": [9]}, 409), ({"cmd": "stop", "x": 1}, 422),
                          ({"cmd": 3}, 422), ({"cmd": "stop", "ranks": "0"}, 422),
                          ({"cmd": "stop", "incident": "r#9"}, 409),
                          ({"cmd": "stop", "incident": 9}, 422)]:  # fmt: skip
            got = app.post("/api/run/commands", params={"run": "r"}, headers=auth, json=bad)
            assert got.status_code == code, (bad, got.text)
            if "incident" in bad and code == 409:
                assert "run 'r' has no open incident 'r#9'" in got.json()["detail"]
        listed = app.get("/api/run/commands", params={"run": "r"}, headers=auth).json()
        assert [c["id"] for c in listed["commands"]] == [body["id"]]  # the audit history
        scraped = app.get("/metrics", headers=auth).text  # every request counted
        for name, n in [("accepted", 1), ("bad", 6)]:
            assert f"rankwatch_aggregator_command_requests_{name} {n}.0" in scraped, name
        scraped = open_app.get("/metrics").text
        assert "rankwatch_aggregator_command_requests_no_token 1.0" in scraped
    finally:
        agg.stop()
