"""One peer sending frames of absurd shape, on a real ROUTER fed by real DEALERs: the frame is
refused as a whole with one reason, and another peer's records go first (counters, not clocks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import zmq
from rankwatch.agent.wire import records
from rankwatch.aggregator.ingest import receiver as receiver_mod
from rankwatch.aggregator.ingest.receiver import Receiver
from rankwatch.aggregator.service import Aggregator, ServeConfig

from tests.polling import wait_until

from .test_receiver import collect, flat, step
from .test_receiver_limits import drain

# Shaped like a step record, but without the fields that make one (metrics above all).
NOT_A_RECORD = {"kind": "step", "run": "x", "rank": 0, "seq": 1, "time": 0.0, "host": "h",
                "pid": 0, "step": 0, "epoch": None, "world_size": 1}  # fmt: skip


def maps_frame(size: int) -> bytes:
    """A frame of about ``size`` bytes of small maps, none of them a valid record."""
    n = size // len(msgpack.packb(NOT_A_RECORD))
    return msgpack.packb({"v": records.SCHEMA_VERSION, "records": [NOT_A_RECORD] * n})


def test_a_frame_of_more_records_than_its_bytes_hold_is_refused_whole_from_its_header(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    bomb = msgpack.packb({"v": records.SCHEMA_VERSION, "records": [0] * 500_000})
    attacker, agent = dealer(), dealer()
    attacker.send(bomb)
    drain(receiver, 1)
    agent.send(records.encode_frame([step(0, 1)]))
    assert [r.seq for r in collect(receiver, 1)] == [1]
    c = receiver.counters()
    assert c["reasons"] == {"records": 1}  # one reason, one count: not 500,000 bad records
    assert c["frames_rejected"] == c["bad_messages"] == 1 and c["bad_records"] == 0
    assert c["bytes"] >= len(bomb)


def test_a_frame_holding_records_that_are_not_maps_is_refused_whole(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    wire = [records.to_wire(step(0, s)) for s in range(1, 101)]
    frame = msgpack.packb({"v": records.SCHEMA_VERSION, "records": [*wire, 7]})
    dealer().send(frame)
    drain(receiver, 1)
    c = receiver.counters()
    assert c["records"] == 0 and c["reasons"] == {"records": 1} and c["frames_rejected"] == 1


def test_a_real_record_goes_before_a_flooding_peers_backlog(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    bomb = maps_frame(1024 * 1024)
    per_frame = len(msgpack.unpackb(bomb)["records"])
    attacker, agent = dealer(), dealer()
    sent = 20
    for _ in range(sent):
        attacker.send(bomb)
    time.sleep(0.3)  # the flood is queued before the real record comes
    agent.send(records.encode_frame([step(0, 1)]))
    got, deadline = [], time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = flat(receiver.recv(50))
    checked = receiver.counters()["bad_records"]
    assert [r.seq for r in got] == [1]
    # When the real record came out, less than two of the twenty bomb frames had been looked at.
    assert checked < 2 * per_frame, (checked, per_frame)
    # ... and the flood is still counted in the end, record by record (each might be real).
    while receiver.counters()["bad_records"] < sent * per_frame:
        assert time.monotonic() < deadline, receiver.counters()["bad_records"]
        receiver.recv(50)
    assert receiver.counters()["backlog_dropped"] == 0


def test_a_frame_with_bad_records_is_decoded_in_parts_and_its_peer_keeps_its_order(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    n = 3 * receiver_mod.SALVAGE_RECORDS + 10
    mixed = [records.to_wire(step(0, s)) if s % 2 else {"kind": "step"} for s in range(1, n + 1)]
    agent = dealer()
    agent.send(msgpack.packb({"v": records.SCHEMA_VERSION, "records": mixed}))
    agent.send(records.encode_frame([step(0, n + 1)]))
    got = collect(receiver, n // 2 + 1, timeout_s=10)
    assert [r.seq for r in got] == [*range(1, n + 1, 2), n + 1]  # valid ones, in order
    assert receiver.counters()["bad_records"] == n // 2


def test_the_per_peer_buffer_is_set_in_bytes() -> None:
    assert receiver_mod.RCVHWM_MESSAGES * records.MAX_FRAME_BYTES <= receiver_mod.PEER_BUFFER_BYTES
    assert receiver_mod.RCVHWM_MESSAGES >= 1


def test_the_service_counts_a_refused_frame_where_its_counters_go(tmp_path: Path) -> None:
    config = ServeConfig(
        data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
        flush_interval_s=0.05, console_alerts=False,
    )  # fmt: skip
    ctx = zmq.Context()
    try:
        with Aggregator(config) as agg:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{agg.ingest_port}")
            sock.send(msgpack.packb({"v": records.SCHEMA_VERSION, "records": [0] * 100_000}))
            c = wait_until(lambda: (c := agg.counters())["ingest_frames_rejected"] and c)
            sock.close(0)
        assert c["ingest_errors"] == {"records": 1} and c["ingest_bad_records"] == 0
        assert c["ingest_peer_buffer_bytes"] == receiver_mod.PEER_BUFFER_BYTES
        assert c["ingest_backlog_dropped"] == 0 and c["ingest_handshake_incomplete"] == 0
    finally:
        ctx.destroy(linger=0)
