"""Shared fixtures: a clean launcher environment and a real ROUTER socket as the aggregator."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from rankwatch.agent import identity
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.sources import SOURCES_ENV
from rankwatch.agent.wire import records

# Variables a launcher (or the developer's shell) may have set that would change identity.
ENV_VARS = (*identity.INFO_VARS, "MS_ROLE", "SLURM_STEP_ID", "LOCAL_WORLD_SIZE", SOURCES_ENV)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _free_port() -> int:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.close(linger=0)
    return port


class Router:
    """A ROUTER bound on 127.0.0.1 standing in for the aggregator; collects decoded records."""

    def __init__(self, port: int | None = None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.MAXMSGSIZE, records.MAX_FRAME_BYTES)
        self.sock.setsockopt(zmq.LINGER, 0)
        if port is None:
            port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        else:
            self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.port = port
        self.addr = f"tcp://127.0.0.1:{port}"
        self.received: list[records.Record] = []
        self.frames = 0
        self.versions: list[int] = []  # each frame's schema version, in arrival order
        self.peers: set[bytes] = set()

    def poll(self, timeout_s: float) -> None:
        """Receive every frame that arrives within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                continue
            peer, frame = self.sock.recv_multipart()
            self.peers.add(peer)
            self.frames += 1
            self.versions.append(records.frame_envelope(frame)[0])
            self.received.extend(records.decode_frame(frame))

    def wait_for(
        self, done: Callable[[list[records.Record]], bool], timeout_s: float = 10.0
    ) -> list[records.Record]:
        deadline = time.monotonic() + timeout_s
        while not done(self.received):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; received {len(self.received)} records")
            self.poll(0.05)
        return self.received

    def send(self, peer: bytes, message: dict[str, Any]) -> None:
        self.sock.send_multipart([peer, msgpack.packb(message)])

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def router() -> Iterator[Router]:
    r = Router()
    yield r
    r.close()


@pytest.fixture
def router_at() -> Iterator[Callable[[int | None], Router]]:
    """Make more routers, or one on a given port (an aggregator that appears later)."""
    made: list[Router] = []

    def make(port: int | None = None) -> Router:
        made.append(Router(port))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A TCP port nobody listens on right now (for 'no aggregator' and 'appears later')."""
    return _free_port


@pytest.fixture
def make_monitor(tmp_path: Path) -> Iterator[Callable[..., Monitor]]:
    made: list[Monitor] = []

    def make(**kwargs: Any) -> Monitor:
        kwargs.setdefault("run", "test-run")
        kwargs.setdefault("log_dir", tmp_path / "logs")
        mon = Monitor(**kwargs)
        made.append(mon)
        return mon

    yield make
    for mon in made:
        mon.close()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a Python script in a fresh interpreter of this venv, cwd ``tmp_path``.

    The child's environment is this one without launcher variables, plus ``env``. Children
    still running at teardown are killed.
    """
    started: list[subprocess.Popen[str]] = []

    def start(script: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        path = tmp_path / f"child{len(started)}.py"
        path.write_text(script)
        full_env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
        full_env.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, str(path)],
            cwd=tmp_path,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
