"""The node relay with CurveZMQ (``rankwatch relay --curve DIR``) and its bounded route map, on
real sockets: a curve head (the real Aggregator), a curve relay, real Monitors as agents."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.auth
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.agent.wire.curve import CurveError
from rankwatch.aggregator.ingest.receiver import Receiver
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.cli.keys import DIR_MODE, make_pair
from rankwatch.relay import forwarder as relay_mod
from rankwatch.relay.forwarder import Relay

from tests.polling import wait_until

from .test_relay import RUN, Head, Net, dealers, step

needs_curve = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")
CLI = [sys.executable, "-c", "from rankwatch.cli.main import main; main()"]


@pytest.fixture
def ctx() -> Iterator[Net]:
    net = Net()
    yield net
    net.close()


def make_keys(path: Path) -> Path:
    """What `rankwatch keys --dir path` writes: server and client key pairs."""
    path.mkdir(mode=DIR_MODE)
    make_pair(path, "server")
    make_pair(path, "client")
    return path


def agent_dir(path: Path, head: Path, client_secret: Path) -> Path:
    """What a training node holds: the server's public key and one client secret."""
    path.mkdir()
    shutil.copy(head / "server.key", path / "server.key")
    shutil.copy(client_secret, path / client_secret.name)
    return path


@pytest.fixture
def head_keys(tmp_path: Path) -> Path:
    return make_keys(tmp_path / "keys")


@needs_curve
def test_curve_head_relay_and_agents_deliver_and_keyless_agents_are_refused(
    tmp_path: Path, head_keys: Path
) -> None:
    node = agent_dir(tmp_path / "node", head_keys, head_keys / "client.key_secret")
    rogue = make_keys(tmp_path / "rogue")
    intruder = agent_dir(tmp_path / "intruder", head_keys, rogue / "client.key_secret")
    relay_keys = tmp_path / "relay-keys"  # a copy of the head's key directory
    shutil.copytree(head_keys, relay_keys)
    config = ServeConfig(
        data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
        flush_interval_s=0.05, console_alerts=False, curve_dir=head_keys,
    )  # fmt: skip
    with Aggregator(config) as agg:
        relay = Relay("tcp://127.0.0.1:0", f"tcp://127.0.0.1:{agg.ingest_port}",
                      curve_dir=relay_keys)  # fmt: skip
        relay.start()
        addr = f"127.0.0.1:{relay.port}"
        mons: list[Monitor] = []
        try:
            world, steps = 3, 20
            mons = [
                Monitor(RUN, k, world, addr, tmp_path / "logs", curve_dir=node)
                for k in range(world)
            ]
            keyless = Monitor("no-keys", 0, 1, addr, tmp_path / "logs")
            unknown = Monitor("rogue-key", 0, 1, addr, tmp_path / "logs", curve_dir=intruder)
            mons += [keyless, unknown]
            for s in range(steps):
                for mon in mons:
                    mon.log(s, loss=1.0 + 0.01 * mon.rank)
            expected = world * (steps + 1)  # start + steps (heartbeats every 5 s: none yet)
            wait_until(lambda: agg.counters()["records_accepted"] >= expected)

            def refused() -> dict[str, int]:
                return dict(relay.counters()["refused_by"])

            wait_until(lambda: refused().get("auth", 0) >= 1 and sum(refused().values()) >= 2)
            c = relay.counters()
            assert c["refused"] == sum(c["refused_by"].values()) >= 2
            assert c["curve_denied_keys"] >= 1  # the unknown key, by the ZAP handler
            head = agg.counters()
            assert head["ingest_refused"] == 0  # the relay's own key was allowed
            assert head["ingest_connections"] == 1
            assert head["records_accepted"] == expected
            assert [r["run"] for r in agg.snapshot()["runs"]] == [RUN]  # not the other two
        finally:
            for mon in mons:
                mon.close()
            relay.stop(timeout_s=1.0)


@needs_curve
def test_a_relay_without_curve_is_refused_by_a_curve_head(
    ctx: Net, tmp_path: Path, head_keys: Path
) -> None:
    """Why the relay needs --curve: without it the head refuses it, and nothing gets in."""
    receiver = Receiver("127.0.0.1", 0, curve_dir=head_keys)
    relay = Relay("tcp://127.0.0.1:0", f"tcp://127.0.0.1:{receiver.port}", batch_ms=10)
    relay.start()
    try:
        (sock,) = dealers(ctx, relay, 1)
        sock.send(records.encode_frame([step(0, 1)]))

        def polled() -> int:
            assert receiver.recv(50) == []
            return receiver.counters()["refused"]

        wait_until(lambda: polled() >= 1)
    finally:
        relay.stop(timeout_s=0.5)
        receiver.close()


@needs_curve
@pytest.mark.parametrize(
    ("files", "says"),
    [
        (["server.key", "client.key_secret"], "server.key_secret does not exist"),  # an agent's
        (["server.key", "server.key_secret", "client.key"], "client*.key_secret"),
        (["server.key", "server.key_secret", "client.key_secret"], "no client public key"),
    ],
)
def test_a_relay_key_dir_missing_a_file_names_it(
    tmp_path: Path, head_keys: Path, files: list[str], says: str
) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in files:
        shutil.copy(head_keys / name, partial / name)
    with pytest.raises(CurveError, match=says.replace("*", r"\*")):
        Relay("tcp://127.0.0.1:0", "tcp://127.0.0.1:9", curve_dir=partial)


@needs_curve
def test_cli_relay_curve_forwards_to_a_curve_head_and_reports_refusals(
    ctx: Net, tmp_path: Path, head_keys: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "MASTER_"))}
    bad = subprocess.run(
        [*CLI, "relay", "--listen", "tcp://127.0.0.1:0", "--upstream", "127.0.0.1:9",
         "--curve", str(tmp_path / "nowhere")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert bad.returncode == 2 and "rankwatch relay:" in bad.stderr and "nowhere" in bad.stderr
    receiver = Receiver("127.0.0.1", 0, curve_dir=head_keys)
    proc = subprocess.Popen(
        [*CLI, "relay", "--listen", "tcp://127.0.0.1:0", "--upstream",
         f"127.0.0.1:{receiver.port}", "--curve", str(head_keys), "--report-s", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "CurveZMQ" in banner, banner
        port = int(banner.split("tcp://127.0.0.1:")[1].split(",")[0])
        keyed = ctx.socket(zmq.DEALER)
        keyed.curve_serverkey, _ = zmq.auth.load_certificate(head_keys / "server.key")
        keyed.curve_publickey, keyed.curve_secretkey = zmq.auth.load_certificate(
            head_keys / "client.key_secret"
        )
        keyed.connect(f"tcp://127.0.0.1:{port}")
        keyed.send(records.encode_frame([step(0, 1), step(0, 2)]))
        plain = ctx.socket(zmq.DEALER)
        plain.connect(f"tcp://127.0.0.1:{port}")
        plain.send(records.encode_frame([step(1, 1)]))
        got: list[records.Record] = []

        def more() -> bool:
            got.extend(records.unblock(receiver.recv(50)))
            return len(got) >= 2

        wait_until(more)
        assert [(r.rank, r.seq) for r in got] == [(0, 1), (0, 2)]
        assert receiver.counters()["refused"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        receiver.close()
    assert proc.returncode == 0, err
    assert "out 1 frames / 2 records" in out
    refused = int(out.rsplit("refused agents ", 1)[1].split()[0])
    assert refused >= 1, out  # the plain DEALER


def test_the_route_map_is_bounded_oldest_out_and_counted(
    ctx: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_mod, "MAX_ROUTES", 5)
    head = Head(ctx)
    relay = Relay("tcp://127.0.0.1:0", head.addr, batch_ms=10)
    relay.start()
    try:
        socks = dealers(ctx, relay, 8)
        for rank, sock in enumerate(socks):  # one rank per agent, one at a time
            sock.send(records.encode_frame([step(rank, 1)]))
            wait_until(lambda rank=rank: head.pump() >= rank + 1)
        c = relay.counters()
        assert (c["routes"], c["routes_evicted"]) == (5, 3)
        relay_id = head.frames[0][0]
        for rank in (0, 7):  # rank 0 was pushed out, rank 7 is the newest
            control = {"v": 1, "resend_from": 1, "run": RUN, "rank": rank}
            head.sock.send_multipart([relay_id, msgpack.packb(control)])
        assert socks[7].poll(5000) and msgpack.unpackb(socks[7].recv())["rank"] == 7
        wait_until(lambda: relay.counters()["control_unroutable"] == 1)
        assert not socks[0].poll(100)
    finally:
        relay.stop(timeout_s=1.0)
        head.close()
