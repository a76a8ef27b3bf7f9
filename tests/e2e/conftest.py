"""End-to-end fixtures: a real `rankwatch serve` subprocess, launchers, JSONL and store readers.

Every process a test starts runs in its own session and is stopped by pid (SIGTERM, then
SIGKILL of its process group) at teardown, pass or fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records
from rankwatch.demo.launcher import rankwatch_command

READY_TIMEOUT_S = 90.0  # serve imports DuckDB, FastAPI and numpy on a busy 2-core machine
STOP_TIMEOUT_S = 20.0
HOST = "127.0.0.1"
BIN = Path(sys.executable).parent


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def get_json(url: str, timeout_s: float = 5.0) -> Any | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def get_json_in_netns(netns: str, url: str, timeout_s: float = 10.0) -> Any | None:
    """GET ``url`` from inside a network namespace (its 127.0.0.1 is not ours)."""
    code = (
        "import sys, urllib.request\n"
        "try:\n"
        f"    sys.stdout.buffer.write(urllib.request.urlopen({url!r}, timeout=5).read())\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-c", code],
            capture_output=True, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout)
    except ValueError:
        return None


def stop_process(proc: subprocess.Popen[Any], first: int = signal.SIGTERM) -> None:
    """Stop ``proc`` (a session leader) and everything left in its process group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@dataclass
class Serve:
    """One running `rankwatch serve`."""

    proc: subprocess.Popen[bytes]
    data: Path
    port: int
    ingest_port: int
    log: Path
    host: str = HOST
    netns: str | None = None  # queries run inside this network namespace

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ingest_addr(self) -> str:
        return f"{self.host}:{self.ingest_port}"

    def get(self, path: str) -> Any | None:
        if self.netns is not None:
            return get_json_in_netns(self.netns, self.http + path)
        return get_json(self.http + path)

    def run_entry(self, run: str) -> dict[str, Any] | None:
        snapshot = self.get("/api/status") or {}
        for entry in snapshot.get("runs") or []:
            if entry.get("run") == run:
                return dict(entry)
        return None

    def rank_states(self, run: str) -> dict[int, dict[str, Any]]:
        entry = self.run_entry(run) or {}
        return {row["rank"]: row for row in entry.get("ranks") or []}

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """Poll ``predicate`` until truthy; fail with the serve log tail on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"rankwatch serve exited ({self.proc.returncode}):\n{self.tail()}")
            time.sleep(0.25)
        pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}\n{self.tail()}")

    def wait_ready(self) -> None:
        self.wait_for("rankwatch serve to answer", lambda: self.get("/api/status"), READY_TIMEOUT_S)

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        stop_process(self.proc)


def serve_command(
    data: Path,
    port: int,
    ingest_port: int,
    host: str = HOST,
    ingest_host: str = HOST,
    extra: Sequence[str] = (),
) -> list[str]:
    """`rankwatch serve`: dashboard on ``host``, ingest on ``ingest_host`` (``*``: all)."""
    cmd = [*rankwatch_command(), "serve", "--data", str(data), "--host", host]
    cmd += ["--port", str(port), "--ingest-host", ingest_host, "--ingest-port", str(ingest_port)]
    return [*cmd, *extra]


def lost_after_config(path: Path, seconds: float) -> list[str]:
    """Extra serve arguments for a short lost-rank limit (it has no flag; the config has it)."""
    path.write_text(f"[serve]\nlost_after_s = {float(seconds)}\n", encoding="utf-8")
    return ["--config", str(path)]


def start_serve(
    data: Path,
    *,
    port: int | None = None,
    ingest_port: int | None = None,
    host: str = HOST,
    ingest_host: str = HOST,
    extra: Sequence[str] = (),
    netns: str | None = None,
) -> Serve:
    """Start serve, inside network namespace ``netns`` when given."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    port = port or free_port()
    ingest_port = ingest_port or free_port()
    data.mkdir(parents=True, exist_ok=True)
    log = data / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*prefix, *serve_command(data, port, ingest_port, host, ingest_host, extra)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Serve(proc, data, port, ingest_port, log, host, netns)


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    """``serve_factory(**kwargs)`` starts a serve and waits until /api/status answers."""
    started: list[Serve] = []

    def factory(data: Path | None = None, wait: bool = True, **kwargs: Any) -> Serve:
        serve = start_serve(data or tmp_path / f"data{len(started)}", **kwargs)
        started.append(serve)
        if wait:
            serve.wait_ready()
        return serve

    yield factory
    for serve in started:
        serve.stop()


@pytest.fixture
def serve(serve_factory: Callable[..., Serve]) -> Serve:
    return serve_factory()


# --- launchers ---------------------------------------------------------------------------


def require_msrun() -> str:
    """The msrun executable of this environment, or skip with the reason."""
    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("MindSpore is not installed (pip install 'rankwatch[mindspore]')")
    msrun = shutil.which("msrun", path=str(BIN)) or shutil.which("msrun")
    if msrun is None:
        pytest.skip("msrun is not on PATH (it comes with MindSpore)")
    return msrun


def require_torchrun() -> str:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (pip install 'rankwatch[torch]')")
    torchrun = shutil.which("torchrun", path=str(BIN)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH (it comes with PyTorch)")
    return torchrun


def launch_env(**extra: str) -> dict[str, str]:
    """This environment with the venv's bin first (msrun finds `python` on PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["RANKWATCH_TELEMETRY"] = "off"  # records are counted exactly; telemetry is tested alone
    env.update(extra)
    return env


def run_launcher(
    cmd: Sequence[str],
    env: dict[str, str],
    log: Path,
    timeout_s: float,
    cwd: Path | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> int:
    """Run a launcher to the end in its own session; kill its group on timeout (or when
    ``meanwhile``, called once the launcher has started, fails)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            if meanwhile is not None:
                meanwhile()
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process(proc, signal.SIGINT)
            pytest.fail(f"{cmd[0]} did not finish within {timeout_s:g} s; log {log}")
        finally:
            stop_process(proc, signal.SIGINT)


@dataclass
class FlagWatcher:
    """Polls /api/status in a thread and keeps the first sighting of every divergence."""

    serve: Serve
    run: str
    interval_s: float = 0.3
    first: dict[tuple[int, str, str], dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> FlagWatcher:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        entry = self.serve.run_entry(self.run) or {}
        for div in entry.get("divergences") or []:
            key = (div["rank"], div["kind"], div["metric"])
            if key not in self.first:
                self.first[key] = dict(div, seen_at_last_step=entry.get("last_step"))

    def flagged_ranks(self) -> set[int]:
        return {rank for rank, _, _ in self.first}


# --- what the ranks wrote, and what the aggregator stored ----------------------------------


def read_jsonl(run_dir: Path) -> dict[int, list[records.Record]]:
    """rank -> decoded records of ``<log_dir>/<run>/rank<k>.jsonl``."""
    out: dict[int, list[records.Record]] = {}
    for path in sorted(run_dir.glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        lines = path.read_text(encoding="utf-8").splitlines()
        out[rank] = [records.from_json_line(line) for line in lines if line.strip()]
    return out


def events_by_rank(recs: dict[int, list[records.Record]], kind: str) -> dict[int, list[Any]]:
    return {
        rank: [r for r in rs if isinstance(r, records.EventRecord) and r.event == kind]
        for rank, rs in recs.items()
    }


def canonical(record: records.Record) -> str:
    """A record as sorted JSON, so NaN compares equal to NaN and map order does not matter.
    A heartbeat's stack sample is left out: the store keeps a rank's latest one aside, not
    one per heartbeat (``assert_store_matches_jsonl`` checks that one)."""
    line = json.loads(records.to_json_line(record))
    line.pop("v", None)
    if line.get("kind") == "heartbeat":
        line.pop("stack", None)
    return json.dumps(line, sort_keys=True)


def latest_stacks(written: list[records.Record]) -> str | None:
    beats = [r for r in written if isinstance(r, records.Heartbeat) and r.stack is not None]
    if not beats:
        return None
    last = max(beats, key=lambda r: r.stack.time if r.stack is not None else 0.0)
    return json.dumps(json.loads(records.to_json_line(last))["stack"], sort_keys=True)


def stored_records(data: Path, run: str) -> dict[int, list[records.Record]]:
    """rank -> records the aggregator stored for ``run`` (open only after serve has stopped)."""
    from rankwatch.aggregator.store.db import Store

    store = Store(data)
    try:
        out: dict[int, list[records.Record]] = {}
        for record in store.records(run):
            out.setdefault(record.rank, []).append(record)
        return out
    finally:
        store.close()


def assert_store_matches_jsonl(
    data: Path, run: str, jsonl: dict[int, list[records.Record]]
) -> None:
    """Every rank's JSONL equals what the store holds, record by record, keyed by (rank, seq)."""
    stored = stored_records(data, run)
    assert sorted(stored) == sorted(jsonl), "ranks in the store differ from the JSONL files"
    from rankwatch.aggregator.store.db import Store

    with Store(data) as store:
        stacks = {rank: json.dumps(s, sort_keys=True) for rank, s in store.stacks(run).items()}
    want_stacks = {r: s for r, rs in jsonl.items() if (s := latest_stacks(rs)) is not None}
    assert stacks == want_stacks, "each rank's latest stack sample: the store's != the JSONL's"
    for rank, written in jsonl.items():
        want = {r.seq: canonical(r) for r in written}
        have = {r.seq: canonical(r) for r in stored[rank]}
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        assert not missing, f"rank {rank}: seqs in JSONL but not stored: {missing[:20]}"
        assert not extra, f"rank {rank}: seqs stored but not in JSONL: {extra[:20]}"
        differ = [seq for seq in want if want[seq] != have[seq]]
        assert not differ, (
            f"rank {rank}: {len(differ)} records differ, first seq {differ[0]}:\n"
            f"  jsonl {want[differ[0]]}\n  store {have[differ[0]]}"
        )
