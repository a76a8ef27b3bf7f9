"""The node relay on real sockets: agents (raw DEALERs or Monitors) -> relay -> a head ROUTER."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.relay.forwarder import (
    SNDHWM_FRAMES,
    Relay,
    listen_endpoint,
    upstream_endpoint,
)

from tests.polling import wait_until

RUN = "relay-test"


def step(rank: int, seq: int, world: int = 8) -> dict[str, Any]:
    return records.to_wire(
        records.StepRecord(
            run=RUN, rank=rank, seq=seq, time=time.time(), world_size=world, host="n0",
            pid=10 + rank, step=seq, epoch=0, metrics={"loss": 1.0 + rank, "lr": 0.1},
        )
    )  # fmt: skip


class Head:
    """A ROUTER standing in for the aggregator: collects frames and their decoded records."""

    def __init__(self, ctx: Net, port: int | None = None) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if port is None:
            self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        else:
            self.sock.bind(f"tcp://127.0.0.1:{port}")
            self.port = port
        self.addr = f"tcp://127.0.0.1:{self.port}"
        self.frames: list[tuple[bytes, list[records.Record]]] = []

    @property
    def records(self) -> list[records.Record]:
        return [r for _, batch in self.frames for r in batch]

    def pump(self) -> int:
        while self.sock.poll(10):
            identity, frame = self.sock.recv_multipart()
            self.frames.append((identity, records.decode_frame(frame)))
        return len(self.records)

    def close(self) -> None:
        self.sock.close(0)


class Net:
    """Makes sockets and closes them all at the end: a socket garbage-collected unclosed (pyzmq
    warns, and warnings are errors here) would make ``term()`` wait for it forever."""

    def __init__(self) -> None:
        self.context: zmq.Context[Any] = zmq.Context()
        self.opened: list[zmq.Socket[Any]] = []

    def socket(self, kind: int) -> zmq.Socket[Any]:
        sock = self.context.socket(kind)
        self.opened.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.opened:
            sock.close(0)
        self.context.term()


@pytest.fixture
def ctx() -> Iterator[Net]:
    net = Net()
    yield net
    net.close()


@pytest.fixture
def head(ctx: Net) -> Iterator[Head]:
    h = Head(ctx)
    yield h
    h.close()


@pytest.fixture
def relay(head: Head) -> Iterator[Relay]:
    r = Relay("tcp://127.0.0.1:0", head.addr, batch_ms=50)
    r.start()
    yield r
    r.stop(timeout_s=1.0)


def dealers(ctx: Net, relay: Relay, n: int) -> list[zmq.Socket[Any]]:
    out = []
    for _ in range(n):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(f"tcp://127.0.0.1:{relay.port}")
        out.append(sock)
    return out


def test_all_records_arrive_batched_and_in_order_per_rank(
    ctx: Net, head: Head, relay: Relay
) -> None:
    ranks, steps = 8, 25
    socks = dealers(ctx, relay, ranks)
    for s in range(1, steps + 1):
        for rank, sock in enumerate(socks):
            sock.send(records.encode_frame([step(rank, s)]))
    sent = ranks * steps
    wait_until(lambda: head.pump() >= sent)
    got = head.records
    assert len(got) == sent
    assert len(head.frames) < sent / 4  # re-batched: far fewer frames than the agents sent
    assert len({identity for identity, _ in head.frames}) == 1  # one connection to the head
    for rank in range(ranks):
        assert [r.seq for r in got if r.rank == rank] == list(range(1, steps + 1))
    c = relay.counters()
    assert (c["frames_in"], c["records_in"], c["records_out"]) == (sent, sent, sent)
    assert c["frames_out"] == len(head.frames)
    assert c["bad_frames"] == 0
    assert wait_until(lambda: relay.counters()["connections"] == ranks)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1not msgpack", "msgpack"),
        (msgpack.packb([1, 2, 3]), "envelope"),
        (msgpack.packb({"v": 1, "records": "nope"}), "envelope"),
        (msgpack.packb({"records": []}), "envelope"),
        (msgpack.packb({"v": records.SCHEMA_VERSION + 1, "records": []}), "version"),
        (msgpack.packb({"v": 0, "records": []}), "version"),
        # A frame bomb: the head would refuse it whole, so the relay does not forward it.
        (msgpack.packb({"v": records.SCHEMA_VERSION, "records": [0] * 200_000}), "records"),
        (msgpack.packb({"v": records.SCHEMA_VERSION, "records": [step(0, 9), 1]}), "records"),
    ],
)
def test_malformed_frames_are_counted_and_dropped(
    ctx: Net, head: Head, relay: Relay, payload: bytes, reason: str
) -> None:
    (sock,) = dealers(ctx, relay, 1)
    sock.send(records.encode_frame([step(0, 1)]))
    sock.send(payload)
    sock.send(records.encode_frame([step(0, 2)]))
    wait_until(lambda: head.pump() >= 2)
    assert [r.seq for r in head.records] == [1, 2]
    c = relay.counters()
    assert c["bad_frames"] == 1
    assert c["reasons"] == {reason: 1}
    assert c["records_out"] == 2


def test_multipart_message_is_counted(ctx: Net, head: Head, relay: Relay) -> None:
    (sock,) = dealers(ctx, relay, 1)
    sock.send_multipart([records.encode_frame([step(0, 1)]), b"extra"])
    sock.send(records.encode_frame([step(0, 2)]))
    wait_until(lambda: head.pump() >= 1)
    assert [r.seq for r in head.records] == [2]
    assert relay.counters()["reasons"] == {"frames": 1}


def test_records_the_head_rejects_stay_per_record(ctx: Net, head: Head, relay: Relay) -> None:
    """The relay does not validate records: a bad record travels on (the head's receiver drops
    it alone) and does not cost the good records batched with it."""
    (sock,) = dealers(ctx, relay, 1)
    bad = {**step(0, 2), "rank": "zero"}
    sock.send(msgpack.packb({"v": 1, "records": [step(0, 1), bad, step(0, 3)]}))
    wait_until(lambda: head.sock.poll(10))
    _, frame = head.sock.recv_multipart()
    raw = msgpack.unpackb(frame)["records"]
    assert [r["seq"] for r in raw] == [1, 2, 3]
    assert relay.counters()["bad_frames"] == 0


def test_control_is_routed_back_to_the_rank_that_sent(ctx: Net, head: Head, relay: Relay) -> None:
    socks = dealers(ctx, relay, 3)
    for rank, sock in enumerate(socks):
        sock.send(records.encode_frame([step(rank, 1)]))
    wait_until(lambda: head.pump() >= 3)
    relay_id = head.frames[0][0]
    control = {"v": 1, "resend_from": 7, "run": RUN, "rank": 1}
    head.sock.send_multipart([relay_id, msgpack.packb(control)])
    assert socks[1].poll(5000)
    assert msgpack.unpackb(socks[1].recv()) == control
    assert not socks[0].poll(100) and not socks[2].poll(0)
    # Without run and rank the relay cannot tell which rank is meant.
    head.sock.send_multipart([relay_id, msgpack.packb({"v": 1, "resend_from": 7})])
    wait_until(lambda: relay.counters()["control_unroutable"] == 1)
    assert relay.counters()["control_routed"] == 1


def test_head_away_pushes_back_then_everything_arrives(ctx: Net) -> None:
    probe = Head(ctx)
    port = probe.port
    probe.close()  # nothing listens there now
    relay = Relay(
        "tcp://127.0.0.1:0",
        f"tcp://127.0.0.1:{port}",
        batch_ms=10,
        max_pending_bytes=records.MAX_FRAME_BYTES,
    )
    relay.start()
    try:
        (sock,) = dealers(ctx, relay, 1)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        # About 44 MB: more than ZeroMQ's queue to the head (16 frames of about 1 MB) plus the
        # relay's own 4 MB may hold.
        sent = 200_000
        for first in range(1, sent + 1, 500):
            sock.send(records.encode_frame([step(0, s) for s in range(first, first + 500)]))
        wait_until(lambda: relay.counters()["pushback"] >= 1)
        c = relay.counters()
        assert c["frames_out"] <= SNDHWM_FRAMES  # only what ZeroMQ holds for the absent head
        assert c["records_in"] < sent  # it stopped reading instead of growing without bound
        assert c["pending_bytes"] <= 2 * records.MAX_FRAME_BYTES
        head = Head(ctx, port)
        try:
            wait_until(lambda: head.pump() >= sent, timeout_s=30)
            assert [r.seq for r in head.records] == list(range(1, sent + 1))
        finally:
            head.close()
    finally:
        relay.stop(timeout_s=1.0)


def test_stop_forwards_the_open_batch(ctx: Net, head: Head) -> None:
    relay = Relay("tcp://127.0.0.1:0", head.addr, batch_ms=60_000)  # never sent by time
    relay.start()
    (sock,) = dealers(ctx, relay, 1)
    sock.send(records.encode_frame([step(0, 1), step(0, 2)]))
    wait_until(lambda: relay.counters()["records_in"] == 2)
    assert relay.stop(timeout_s=2.0)
    wait_until(lambda: head.pump() == 2)


def test_monitors_through_relay_into_the_aggregator(tmp_path: Path, ctx: Net) -> None:
    config = ServeConfig(
        data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
        flush_interval_s=0.05, console_alerts=False,
    )  # fmt: skip
    with Aggregator(config) as agg:
        relay = Relay("tcp://127.0.0.1:0", f"tcp://127.0.0.1:{agg.ingest_port}")
        relay.start()
        try:
            world, steps = 4, 30
            mons = [
                Monitor(RUN, rank, world, f"127.0.0.1:{relay.port}", tmp_path / "logs")
                for rank in range(world)
            ]
            for s in range(steps):
                for mon in mons:
                    mon.log(s, loss=2.0 + 0.01 * mon.rank, lr=0.1)
            for mon in mons:
                mon.close()
            # start + steps + end per rank (heartbeats come every 5 s: none in this test)
            expected = world * (steps + 2)
            wait_until(lambda: agg.counters()["records_accepted"] >= expected)
            c = agg.counters()
            assert c["records_accepted"] == expected
            assert c["ingest_connections"] == 1  # the head saw only the relay
            assert c["ingest_messages"] < expected
            agg.flush_store()
            (run,) = agg.store.runs()
            assert run["records"] == expected
        finally:
            relay.stop(timeout_s=1.0)


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("tcp://*:8671", "tcp://*:8671"),
        ("8671", "tcp://*:8671"),
        ("127.0.0.1:9000", "tcp://127.0.0.1:9000"),
        ("tcp://127.0.0.1:0", "tcp://127.0.0.1:*"),
        ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"),
        ("ipc://relay.sock", "ipc://relay.sock"),
    ],
)
def test_listen_endpoint(text: str, endpoint: str) -> None:
    assert listen_endpoint(text) == endpoint


@pytest.mark.parametrize("text", ["", "localhost", "tcp://h:port", "h:70000", ":9"])
def test_listen_endpoint_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="listen address"):
        listen_endpoint(text)


@pytest.mark.parametrize(
    ("explicit", "env", "expected"),
    [
        ("head:9000", {"RANKWATCH_ADDR": "other"}, "tcp://head:9000"),
        (None, {"RANKWATCH_ADDR": "head2"}, "tcp://head2:8671"),
        (None, {"MS_SCHED_HOST": "10.0.0.1", "MS_SCHED_PORT": "8118"}, "tcp://10.0.0.1:8671"),
        (None, {"MASTER_ADDR": "master"}, "tcp://master:8671"),
        ("127.0.0.1:8671", {}, "tcp://127.0.0.1:8671"),  # another port than the listen one
    ],
)
def test_upstream_endpoint(explicit: str | None, env: dict[str, str], expected: str) -> None:
    assert upstream_endpoint(explicit, env, "tcp://*:9999") == expected


@pytest.mark.parametrize(
    ("explicit", "env", "match"),
    [
        (None, {}, "no upstream"),
        (None, {"RANKWATCH_ADDR": "127.0.0.1:8671"}, "own listen address"),
        ("localhost", {}, "own listen address"),
        ("tcp://h:x", {}, "bad port"),
    ],
)
def test_upstream_endpoint_rejects(explicit: str | None, env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        upstream_endpoint(explicit, env, "tcp://*:8671")


_PLAIN = "from rankwatch.cli.main import main; main()"


# The relay runs on every training node, where only the agent is installed (pyzmq, msgpack).
_AGENT_ONLY = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"msgspec", "duckdb", "numpy", "fastapi", "uvicorn",
                                      "pyarrow"}:
            raise ImportError(f"blocked for this test: {name}")
sys.meta_path.insert(0, Blocker())
from rankwatch.cli.main import main
main()
"""


@pytest.mark.parametrize("code", [_PLAIN, _AGENT_ONLY], ids=["installed", "agent-deps-only"])
def test_cli_relay_forwards_and_reports_on_sigterm(ctx: Net, head: Head, code: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANKWATCH_ADDR", "MASTER_ADDR")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "relay", "--listen", "tcp://127.0.0.1:0",
         "--upstream", head.addr, "--report-s", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "forwarding to" in banner, banner
        port = int(banner.split("tcp://127.0.0.1:")[1].split(",")[0])
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(records.encode_frame([step(0, 1), step(0, 2)]))
        sock.send(b"junk")
        wait_until(lambda: head.pump() >= 2)
        sock.close(0)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "out 1 frames / 2 records" in out
    assert "bad frames 1 (msgpack 1)" in out
