"""Optional CurveZMQ on ingest: `rankwatch keys`, `rankwatch serve --curve DIR`, agents with
``RANKWATCH_CURVE_DIR``. Only agents holding an allowed client key get a record in; the
others are refused and counted."""

from __future__ import annotations

import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import zmq.auth
from rankwatch.agent import Monitor
from rankwatch.agent.wire.curve import curve_keys

from .conftest import Spawner
from .procs import SERVE, compare, read_jsonl, read_store, wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE"),
]

KEY_FILES = ("client.key", "client.key_secret", "server.key", "server.key_secret")


def keys(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVE, "keys", *args], capture_output=True, text=True, timeout=60)


def _agent_dir(path: Path, server: Path, client_secret: Path) -> Path:
    """What a training node holds: the server's public key and its own client secret."""
    path.mkdir()
    shutil.copy(server / "server.key", path / "server.key")
    shutil.copy(client_secret, path / client_secret.name)
    return path


def test_keys_makes_the_key_files_with_private_modes(tmp_path: Path) -> None:
    head = tmp_path / "keys"
    done = keys("--dir", str(head))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in head.iterdir()) == sorted(KEY_FILES)
    assert stat.S_IMODE(head.stat().st_mode) == 0o700
    for name in KEY_FILES:
        mode = stat.S_IMODE((head / name).stat().st_mode)
        assert mode == (0o600 if name.endswith("_secret") else 0o644), (name, oct(mode))
    for who in ("server", "client"):
        public, secret = zmq.auth.load_certificate(head / f"{who}.key_secret")
        assert secret and zmq.auth.load_certificate(head / f"{who}.key") == (public, None)
    before = {p.name: p.read_bytes() for p in head.iterdir()}
    again = keys("--dir", str(head))
    assert again.returncode == 2 and "already exists" in again.stderr
    assert {p.name: p.read_bytes() for p in head.iterdir()} == before  # nothing overwritten
    more = keys("--dir", str(head), "--client", "node7")
    assert more.returncode == 0, more.stderr
    assert stat.S_IMODE((head / "client-node7.key_secret").stat().st_mode) == 0o600
    node = _agent_dir(tmp_path / "node7", head, head / "client-node7.key_secret")
    public, _ = zmq.auth.load_certificate(head / "client-node7.key")
    assert curve_keys(node).public == public
    bad = keys("--dir", str(tmp_path / "nowhere"), "--client", "x")
    assert bad.returncode == 2 and "no server.key" in bad.stderr


def test_an_agent_with_a_bad_key_dir_fails_at_construction(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"client\*\.key_secret"):
        Monitor(run="c", rank=0, world_size=1, addr="127.0.0.1:9", log_dir=tmp_path,
                curve_dir=empty)  # fmt: skip
    assert not (tmp_path / "c").exists()  # nothing half-made


def test_serve_refuses_a_key_dir_without_keys(tmp_path: Path) -> None:
    (tmp_path / "k").mkdir()
    done = subprocess.run(
        [*SERVE, "serve", "--data", str(tmp_path / "d"), "--port", "0", "--ingest-port", "0",
         "--curve", str(tmp_path / "k")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "server.key_secret does not exist" in done.stderr and "rankwatch keys" in done.stderr


def test_curve_ingest_admits_only_agents_with_an_allowed_key(
    spawn: Spawner, tmp_path: Path, report: Any
) -> None:
    head, rogue = tmp_path / "head", tmp_path / "rogue"
    assert keys("--dir", str(head)).returncode == 0
    assert keys("--dir", str(rogue)).returncode == 0
    node = _agent_dir(tmp_path / "node", head, head / "client.key_secret")
    # Knows the server's public key but holds a client key the aggregator never allowed.
    intruder = _agent_dir(tmp_path / "intruder", head, rogue / "client.key_secret")
    serve = spawn.serve(extra=["--curve", str(head)])
    assert "ingest is encrypted (CurveZMQ)" in serve.output()
    stop = tmp_path / "stop"
    logs = tmp_path / "logs"
    keyed = {"RANKWATCH_CURVE_DIR": str(node)}
    good = [spawn.rank("curve-ok", k, 2, serve.addr, logs, stop_file=stop, env=keyed)
            for k in range(2)]  # fmt: skip
    plain = spawn.rank("curve-plain", 0, 1, serve.addr, logs, stop_file=stop)
    rogue_rank = spawn.rank("curve-rogue", 0, 1, serve.addr, logs, stop_file=stop,
                            env={"RANKWATCH_CURVE_DIR": str(intruder)})  # fmt: skip
    wait_until("the agents with the key to be alive",
               lambda: serve.rank_states("curve-ok") == {0: "alive", 1: "alive"}, 60)  # fmt: skip

    def refused() -> dict[str, float]:
        by = serve.metrics().get("rankwatch_aggregator_ingest_refused_by", {})
        return {dict(labels)["kind"]: value for labels, value in by.items()}

    wait_until(
        "the refused handshakes to be counted",
        # auth: the unknown key; protocol/other: the agent without curve (libzmq reports a
        # plaintext greeting to a curve server either way).
        lambda: refused().get("auth", 0) >= 1 and sum(refused().values()) >= 2,
        30,
        detail=lambda: f"{refused()}\n{serve.tail()}",
    )
    time.sleep(2.0)  # the refused agents keep trying meanwhile
    runs = {r["run"] for r in serve.get("/api/runs")["runs"]}
    assert runs == {"curve-ok"}
    total_refused, refused_by = serve.counter("ingest_refused"), refused()
    assert total_refused >= 2
    assert "refused an agent with unknown CurveZMQ key" in serve.output()
    stop.touch()
    assert [r.wait(30) for r in [*good, plain, rogue_rank]] == [0, 0, 0, 0]
    finished = {0: "finished", 1: "finished"}
    wait_until("the good ranks to finish",
               lambda: serve.rank_states("curve-ok") == finished, 30)  # fmt: skip
    assert serve.stop() == 0
    result = compare(read_store(serve.data, "curve-ok"), read_jsonl(logs / "curve-ok"))
    assert read_store(serve.data, "curve-plain") == {} == read_store(serve.data, "curve-rogue")
    report(
        kind="access", what="CurveZMQ ingest: 2 agents with the key, 1 without curve, 1 with an "
        "unknown key", result=f"only the keyed run stored; {int(total_refused)} handshakes "
        f"refused ({refused_by})", **result,
    )  # fmt: skip
    assert result == {**result, "missing": 0, "extra": 0, "differ": 0}
