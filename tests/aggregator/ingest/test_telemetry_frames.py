"""Telemetry frames (schema version 2) on the aggregator's ingest path: the msgspec fast path
leaves them to the schema's decoder, and a real receiver passes the records on decoded."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import zmq
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import StepRecord, TelemetryRecord, frame_groups, to_wire
from rankwatch.aggregator.ingest import frames
from rankwatch.aggregator.ingest.receiver import Receiver

from .test_receiver import collect, step


def tele(rank: int, seq: int, temp: float = 60.0) -> TelemetryRecord:
    return TelemetryRecord(
        "r1", rank, seq, 1000.0 + seq, "h", 1, "gpu", f"gpu:{rank}",
        {"gpu/temp_c": temp, "gpu/util_pct": 99.0}, {"gpu/throttle": ""},
    )  # fmt: skip


def test_the_fast_path_hands_telemetry_to_the_schemas_decoder() -> None:
    frame = records.encode_frame([tele(0, 1), tele(0, 2, temp=91.0)])
    assert frames.decode_fast(frame) is None
    got = frames.decode_frame_blocks(frame)
    assert got == [tele(0, 1), tele(0, 2, temp=91.0)]
    mixed = records.encode_frame([step(0, 3), tele(0, 4)])  # no agent sends one; still read
    assert [type(r) for r in frames.decode_frame_blocks(mixed)] == [StepRecord, TelemetryRecord]


def test_a_receiver_passes_telemetry_on_beside_the_steps(
    dealer: Callable[[], zmq.Socket], receiver: Receiver
) -> None:
    agent = dealer()
    wire = [to_wire(step(0, 1)), to_wire(tele(0, 2)), to_wire(step(0, 3)), to_wire(tele(0, 4))]
    for part in frame_groups(wire):
        agent.send(records.encode_frame(part))
    got = collect(receiver, 4)
    assert sorted((type(r).__name__, r.seq) for r in got) == [
        ("StepRecord", 1), ("StepRecord", 3), ("TelemetryRecord", 2), ("TelemetryRecord", 4),
    ]  # fmt: skip
    assert [r for r in got if isinstance(r, TelemetryRecord)] == [tele(0, 2), tele(0, 4)]
    counters = receiver.counters()
    assert counters["messages"] == 2 and counters["records"] == 4
    assert counters["reasons"] == {}


def test_real_host_values_from_a_real_monitor_arrive_decoded(
    receiver: Receiver, tmp_path: Path
) -> None:
    addr = f"tcp://127.0.0.1:{receiver.port}"
    got: list = []
    with Monitor(run="live", addr=addr, log_dir=tmp_path, telemetry="host,0.1s") as mon:
        deadline = time.monotonic() + 15
        step = 0
        while sum(isinstance(r, TelemetryRecord) for r in got) < 3:
            assert time.monotonic() < deadline, got
            step += 1
            mon.log(step, loss=1.0 / step)
            got.extend(records.unblock(receiver.recv(20)))
    tele = [r for r in got if isinstance(r, TelemetryRecord)]
    assert {(r.run, r.rank, r.source, r.device, r.host, r.pid) for r in tele} == {
        ("live", 0, "host", "", mon.host, mon.pid)
    }
    last = tele[-1].values
    assert 0 <= last["host/cpu_pct"] <= 100 and last["host/rss_bytes"] > 1e6
    assert last["host/mem_available_bytes"] > 0 and last["host/disk_free_log_bytes"] > 0
    assert {r.inc for r in got} == {mon.incarnation}
    steps = [r.seq for r in got if isinstance(r, StepRecord)]
    seqs = sorted(steps + [r.seq for r in tele])
    assert len(set(seqs)) == len(seqs)  # one counter: no seq used twice
    assert receiver.counters()["reasons"] == {}
