"""Receiver: a real ROUTER on 127.0.0.1 fed by real DEALER sockets."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import Record, StepBlock, StepRecord, unblock
from rankwatch.aggregator.ingest.receiver import Receiver


def step(rank: int, seq: int, run: str = "r1", loss: float = 1.0) -> StepRecord:
    return StepRecord(
        run=run, rank=rank, seq=seq, time=1000.0 + seq, world_size=2, host="h", pid=1,
        step=seq, epoch=None, metrics={"loss": loss},
    )  # fmt: skip


def flat(items: list[Record | StepBlock]) -> list[Record]:
    return unblock(items)


def collect(rx: Receiver, want: int, timeout_s: float = 5.0) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(flat(rx.recv(50)))
    return got


def test_valid_frames_from_two_agents_arrive_and_are_counted_per_sender(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    a, b = dealer(), dealer()
    for seq in range(1, 11):
        a.send(records.encode_frame([step(0, seq)]))
    b.send(records.encode_frame([step(1, s) for s in range(1, 51)]))  # one batched frame
    got = collect(receiver, 60)
    assert sorted((r.rank, r.seq) for r in got) == sorted(
        [(0, s) for s in range(1, 11)] + [(1, s) for s in range(1, 51)]
    )
    counters = receiver.counters()
    assert counters["messages"] == 11 and counters["records"] == 60
    assert counters["senders"]["r1/0"]["messages"] == 10
    assert counters["senders"]["r1/1"]["records"] == 50
    assert receiver.identity_of("r1", 1) is not None


def test_a_batched_frame_of_one_rank_arrives_as_one_block_holding_its_records(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    sent = [step(3, s, loss=0.5 * s) for s in range(1, 41)]
    mixed = [step(4, 1), records.Heartbeat("r1", 4, 2, 1001.0, 1, 5.0, 0)]
    a, b = dealer(), dealer()
    a.send(records.encode_frame(sent))
    b.send(records.encode_frame(mixed))  # not all step records: records, as before
    items: list[Record | StepBlock] = []
    deadline = time.monotonic() + 5.0
    while len(flat(items)) < 42 and time.monotonic() < deadline:
        items += receiver.recv(50)
    blocks = [i for i in items if isinstance(i, StepBlock)]
    assert len(blocks) == 1 and blocks[0].records() == sent
    assert sorted(type(i).__name__ for i in items) == ["Heartbeat", "StepBlock", "StepRecord"]
    assert receiver.counters()["records"] == 42


def test_malformed_input_is_counted_by_reason_logged_once_and_valid_traffic_flows(
    dealer: Callable[[], zmq.Socket], receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    bad = dealer()
    good = dealer()
    bad.send(records.encode_frame([step(5, 1)]))  # first a valid one: the sender gets a name
    collect(receiver, 1)
    caplog.set_level(logging.WARNING, logger="rankwatch.receiver")
    for _ in range(3):
        bad.send(b"\xc1 not msgpack")  # 0xc1 is never valid msgpack
    bad.send(msgpack.packb([1, 2, 3]))
    bad.send(msgpack.packb({"v": 99, "records": []}))
    bad.send_multipart([b"extra", b"frames"])
    half_bad = [records.to_wire(step(5, 2)), {"kind": "step", "run": "r1"}]
    bad.send(records.encode_frame(half_bad))
    for seq in range(1, 6):
        good.send(records.encode_frame([step(0, seq)]))
    got = collect(receiver, 6)
    time.sleep(0.1)
    got += flat(receiver.recv(50))
    assert sorted((r.rank, r.seq) for r in got) == [(0, s) for s in range(1, 6)] + [(5, 2)]
    counters = receiver.counters()
    assert counters["reasons"] == {
        "msgpack": 3, "envelope": 1, "version": 1, "frames": 1, "field": 1,
    }  # fmt: skip
    assert counters["bad_messages"] == 6 and counters["bad_records"] == 1
    assert counters["senders"]["r1/5"]["bad"]["msgpack"] == 3
    warnings = [r.getMessage() for r in caplog.records if "r1/5" in r.getMessage()]
    assert len(warnings) == 5  # one per reason, not one per bad message
    assert any("newer than this aggregator" in w for w in warnings)


def test_oversized_frame_drops_that_connection_only(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    big_sender = dealer()
    other = dealer()
    other.send(records.encode_frame([step(0, 1)]))
    big_sender.send(records.encode_frame([step(1, 1)]))
    assert len(collect(receiver, 2)) == 2
    big_sender.send(b"\x00" * (records.MAX_FRAME_BYTES + 1024))
    deadline = time.monotonic() + 5
    while receiver.counters()["disconnects"] == 0 and time.monotonic() < deadline:
        receiver.recv(20)
    assert receiver.counters()["disconnects"] >= 1
    other.send(records.encode_frame([step(0, 2)]))
    time.sleep(0.3)  # the DEALER reconnects by itself
    big_sender.send(records.encode_frame([step(1, 2)]))
    got = collect(receiver, 2)
    assert sorted((r.rank, r.seq) for r in got) == [(0, 2), (1, 2)]


def test_resend_request_reaches_the_agent_and_unknown_peers_are_counted(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    agent = dealer()
    agent.send(records.encode_frame([step(3, 7)]))
    assert len(collect(receiver, 1)) == 1
    assert receiver.request_resend("r1", 3, 4)
    assert not receiver.request_resend("r1", 99, 1)  # never heard of that rank
    receiver.send_control(b"\x00nobody", {"v": 1, "resend_from": 1})
    receiver.recv(0)  # control is flushed by the receiving thread
    assert agent.poll(2000)
    assert msgpack.unpackb(agent.recv()) == {"v": 1, "resend_from": 4, "run": "r1", "rank": 3}
    counters = receiver.counters()
    assert counters["control_sent"] == 1 and counters["control_failed"] == 1


def test_bind_error_names_the_endpoint(ctx: zmq.Context, receiver: Receiver) -> None:
    with pytest.raises(OSError, match=f"127.0.0.1:{receiver.port}"):
        Receiver("127.0.0.1", receiver.port, context=ctx)


def test_every_rank_behind_a_relay_is_reachable_for_resends(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    relay = dealer()  # one connection carrying several ranks, as `rankwatch relay` sends them
    relay.send(records.encode_frame([step(0, 1), step(1, 1)]))
    relay.send(records.encode_frame([step(2, 1), step(5, 1)]))
    assert len(collect(receiver, 4)) == 4
    for rank in (0, 1, 2, 5):
        assert receiver.request_resend("r1", rank, 1)
    receiver.recv(0)
    got = []
    while relay.poll(2000) and len(got) < 4:
        got.append(msgpack.unpackb(relay.recv()))
    assert sorted(m["rank"] for m in got) == [0, 1, 2, 5]
    assert all(m["run"] == "r1" and m["resend_from"] == 1 for m in got)
