"""Monitor and sender over real ZeroMQ sockets on 127.0.0.1; a ROUTER plays the aggregator."""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from rankwatch.agent import sender as sender_module
from rankwatch.agent.sender import Sender
from rankwatch.agent.wire import records

Record = records.Record


def read_jsonl(path: Path) -> list[Record]:
    return [records.from_json_line(line) for line in path.read_text().splitlines()]


def text(rec: Record) -> str:
    """A record in a form where NaN equals NaN (its canonical JSONL line)."""
    return records.to_json_line(rec)


def steps(recs: list[Record]) -> list[records.StepRecord]:
    return [r for r in recs if isinstance(r, records.StepRecord)]


def has_event(kind: str) -> Any:
    return lambda recs: any(getattr(r, "event", None) == kind for r in recs)


METRICS = {
    "loss": 0.25,
    "nan": math.nan,
    "inf": math.inf,
    "ninf": -math.inf,
    "np": np.float32(1.5),
    "int": 7,
    "tiny": 5e-324,
    "ü/name": -0.0,
}


def test_what_arrives_equals_the_jsonl(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr, heartbeat_s=0.05)
    for step in range(1, 51):
        mon.log(step, epoch=0, **METRICS)
    mon.event("eval", step=50, accuracy=math.nan)
    time.sleep(0.12)  # let a heartbeat or two go out
    mon.close()
    received = router.wait_for(has_event("end"))
    on_disk = read_jsonl(mon.jsonl_path)
    assert sorted(text(r) for r in received) == sorted(text(r) for r in on_disk)
    assert len(steps(received)) == 50
    assert any(isinstance(r, records.Heartbeat) for r in received)
    rec = steps(received)[-1]
    assert math.isnan(rec.metrics["nan"]) and rec.metrics["ninf"] == -math.inf
    assert math.copysign(1, rec.metrics["ü/name"]) == -1
    assert len(router.peers) == 1


def test_no_aggregator_close_is_prompt_and_jsonl_complete(
    make_monitor: Any, free_port: Any
) -> None:
    mon = make_monitor(addr=f"127.0.0.1:{free_port()}")
    for step in range(1, 2001):
        mon.log(step, loss=1.0 / step)
    started = time.monotonic()
    mon.close()
    assert time.monotonic() - started < 2.5
    assert [r.step for r in steps(read_jsonl(mon.jsonl_path))] == list(range(1, 2001))


def test_aggregator_appearing_mid_run_gets_later_records(
    make_monitor: Any, free_port: Any, router_at: Any
) -> None:
    port = free_port()
    mon = make_monitor(addr=f"tcp://127.0.0.1:{port}")
    for step in range(1, 51):
        mon.log(step, loss=1.0)
    time.sleep(0.3)  # the agent tries to connect and fails meanwhile
    late = router_at(port)
    for step in range(51, 101):
        mon.log(step, loss=1.0)
        time.sleep(0.001)
    got = late.wait_for(lambda recs: {r.step for r in steps(recs)} >= set(range(51, 101)))
    assert mon.dropped == 0
    # ZeroMQ queued the early ones for the absent peer, so they arrive too.
    assert {r.step for r in steps(got)} == set(range(1, 101))
    mon.close()


def test_refused_frames_stay_pending_until_the_aggregator_comes(
    make_monitor: Any, free_port: Any, router_at: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sender_module, "SNDHWM_FRAMES", 2)  # ZeroMQ holds almost nothing
    monkeypatch.setattr(sender_module, "MAX_BATCH_RECORDS", 1)  # one record per frame
    port = free_port()
    mon = make_monitor(addr=f"127.0.0.1:{port}")
    for step in range(1, 41):
        mon.log(step, loss=1.0)
    deadline = time.monotonic() + 5
    while not mon._sender._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mon._sender._pending, "ZeroMQ never refused a frame"
    late = router_at(port)
    late.wait_for(lambda recs: {r.step for r in steps(recs)} == set(range(1, 41)))
    assert mon.dropped == 0
    mon.close()


def test_full_queue_drops_are_counted_and_reported(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr, queue_max=5, heartbeat_s=0.05)
    n = 20_000
    for step in range(1, n + 1):
        mon.log(step, loss=1.0)
    assert mon.dropped > 0
    dropped = mon.dropped

    def reported(recs: list[Record]) -> bool:
        return any(isinstance(r, records.Heartbeat) and r.dropped == dropped for r in recs)

    router.wait_for(reported)
    mon.close()
    received = router.wait_for(has_event("end"))
    # Every step was either sent or counted as dropped, and the JSONL file has them all.
    assert len({r.seq for r in steps(received)}) + dropped == n
    assert len(steps(read_jsonl(mon.jsonl_path))) == n


def test_heartbeats_say_when_the_next_is_due(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr, heartbeat_s=0.05)
    mon.log(7, loss=1.0)

    def beats(recs: list[Record]) -> list[records.Heartbeat]:
        return [r for r in recs if isinstance(r, records.Heartbeat)]

    router.wait_for(lambda recs: any(b.last_step == 7 for b in beats(recs)))
    beat = next(b for b in beats(router.received) if b.last_step == 7)
    assert (beat.next_in, beat.dropped, beat.paused) == (0.05, 0, None)
    with mon.pause(30, "checkpoint"):
        router.wait_for(lambda recs: any(b.paused == "checkpoint" for b in beats(recs)))
        paused = next(b for b in beats(router.received) if b.paused)
        assert 29 < paused.next_in <= 30
        count = len(router.received)
    router.wait_for(lambda recs: any(b.paused is None for b in beats(recs[count:])))
    mon.close()
    assert any(isinstance(r, records.Heartbeat) for r in read_jsonl(mon.jsonl_path))


def test_resend_request_replays_the_jsonl(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr)
    for step in range(1, 11):
        mon.log(step, loss=float(step))
    router.wait_for(lambda recs: len(steps(recs)) == 10)
    first = {r.seq: text(r) for r in router.received}
    router.send(next(iter(router.peers)), {"v": 1, "oops": 1})  # ignored
    router.send(next(iter(router.peers)), {"v": 1, "resend_from": 5})
    router.wait_for(lambda recs: len(steps(recs)) >= 16)
    again = router.received[len(first) :]
    assert [r.seq for r in again][:7] == list(range(5, 12))  # steps 4..10 (seq 5..11)
    assert all(text(r) == first[r.seq] for r in again if r.seq in first)
    mon.log(11, loss=11.0)  # still working
    mon.close()
    router.wait_for(has_event("end"))


def test_garbage_from_the_aggregator_is_ignored(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr)
    mon.log(1, loss=1.0)
    router.wait_for(lambda recs: len(steps(recs)) == 1)
    peer = next(iter(router.peers))
    router.sock.send_multipart([peer, b"\xc1not msgpack"])
    router.sock.send_multipart([peer, msgpack.packb([1, 2])])
    router.send(peer, {"v": 99, "resend_from": 1})
    mon.log(2, loss=1.0)
    router.wait_for(lambda recs: len(steps(recs)) == 2)
    mon.close()


def test_ipc_endpoint(tmp_path: Path, make_monitor: Any) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{tmp_path}/agg.sock"
    sock.bind(endpoint)
    try:
        mon = make_monitor(addr=endpoint)
        mon.log(1, loss=1.0)
        mon.close()
        got: list[Record] = []
        while not any(getattr(r, "event", None) == "end" for r in got):
            assert sock.poll(5000), "nothing arrived over ipc://"
            got.extend(records.decode_frame(sock.recv_multipart()[1]))
        assert len(steps(got)) == 1
    finally:
        sock.close(linger=0)
        ctx.term()


def test_close_with_aggregator_flushes_everything(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr)
    for step in range(1, 5001):
        mon.log(step, loss=1.0, acc=0.5)
    started = time.monotonic()
    mon.close()
    assert time.monotonic() - started < 2.5
    received = router.wait_for(has_event("end"))
    assert len(steps(received)) == 5000


def wide(seq: int, metrics: int) -> dict[str, Any]:
    names = {f"metric_{i:04d}_" + "x" * 200: float(i) for i in range(metrics)}
    rec = records.StepRecord("r", 0, seq, 1.0, 1, "h", 1, seq, None, names)
    return records.to_wire(rec)


def test_large_batches_are_split_under_the_frame_limit() -> None:
    dropped: list[int] = []
    sender = Sender("tcp://127.0.0.1:1", deque(), {}, lambda: None, 1.0, dropped.append)
    batch = [wide(seq, 1000) for seq in range(1, 31)]  # about 7 MB packed
    frames = list(sender._pack(batch))
    assert len(frames) > 1
    assert all(len(f) <= records.MAX_FRAME_BYTES for f, _ in frames)
    decoded = [r.seq for f, _ in frames for r in records.decode_frame(f)]
    assert decoded == list(range(1, 31)) and sum(n for _, n in frames) == 30
    assert dropped == []


def test_a_record_over_the_frame_limit_is_dropped_and_counted() -> None:
    dropped: list[int] = []
    sender = Sender("tcp://127.0.0.1:1", deque(), {}, lambda: None, 1.0, dropped.append)
    huge = wide(2, 1000)
    huge["metrics"] = {f"{i}-" + "y" * 250: 1.0 for i in range(20_000)}
    frames = list(sender._pack([wide(1, 2), huge, wide(3, 2)]))
    assert [r.seq for f, _ in frames for r in records.decode_frame(f)] == [1, 3]
    assert dropped == [1]


@pytest.mark.parametrize("value", [object(), {1, 2}])
def test_an_unpackable_record_is_dropped_not_fatal(value: Any) -> None:
    dropped: list[int] = []
    sender = Sender("tcp://127.0.0.1:1", deque(), {}, lambda: None, 1.0, dropped.append)
    bad = {**wide(2, 1), "extra": value}
    frames = list(sender._pack([wide(1, 1), bad, wide(3, 1)]))
    assert [r.seq for f, _ in frames for r in records.decode_frame(f)] == [1, 3]
    assert dropped == [1]


def test_telemetry_goes_in_frames_of_its_own_with_version_2(router: Any) -> None:
    queue: deque[Any] = deque()
    sender = Sender(router.addr, queue, {}, lambda: None, 60.0, lambda n: None)
    base = {"run": "r", "rank": 0, "host": "h", "pid": 1}
    for seq in range(1, 7):
        if seq % 2:
            queue.append({"kind": "event", **base, "world_size": 1, "seq": seq, "time": 1.0,
                          "event": "note", "step": None, "info": {}})  # fmt: skip
        else:
            queue.append({"kind": "telemetry", **base, "seq": seq, "time": 1.0, "source": "host",
                          "device": "", "values": {"host/load1": 0.5}, "labels": {}})  # fmt: skip
    sender.start()
    got = router.wait_for(lambda recs: len(recs) == 6)
    assert sender.close(2.0)
    assert router.frames == 2 and sorted(router.versions) == [1, 2]
    by_kind = {r.kind: [] for r in got}
    for r in got:
        by_kind[r.kind].append(r.seq)
    assert by_kind == {"event": [1, 3, 5], "telemetry": [2, 4, 6]}


@pytest.mark.parametrize("version", [1, 2])
def test_a_resend_request_of_either_version_is_taken(
    router: Any, make_monitor: Any, version: int
) -> None:
    mon = make_monitor(addr=router.addr, heartbeat_s=60.0)
    for step in range(1, 4):
        mon.log(step, loss=1.0)
    router.wait_for(lambda recs: len(steps(recs)) == 3)
    router.send(next(iter(router.peers)), {"v": version, "resend_from": 3})  # steps 2 and 3
    router.wait_for(lambda recs: len(steps(recs)) == 5)
    assert mon._sender is not None and mon._sender.resends == 1
