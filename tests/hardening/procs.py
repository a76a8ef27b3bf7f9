"""Real processes for the hardening tests: `rankwatch serve` and ranks (``rank_proc.py``).

Every process runs in its own session and is stopped by its pid (SIGTERM, then SIGKILL of its
process group), pass or fail. Output goes to files in the test's tmp_path, never a pipe that
could fill up.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from rankwatch.agent.wire import records

from tests import polling

HOST = "127.0.0.1"
READY_TIMEOUT_S = 90.0  # serve imports DuckDB, FastAPI and numpy on a busy 2-core machine
STOP_TIMEOUT_S = 20.0
RANK_SCRIPT = Path(__file__).resolve().parent / "rank_proc.py"
SERVE = [sys.executable, "-c", "from rankwatch.cli.main import main; main()"]
_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_PROM_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(
    what: str,
    predicate: Callable[[], Any],
    timeout_s: float = 30.0,
    every_s: float = 0.1,
    detail: Callable[[], Any] | None = None,
) -> Any:
    """``tests.polling.wait_until`` with what is awaited first, and the slower pace and longer
    patience of whole processes."""
    return polling.wait_until(predicate, timeout_s, every_s, what, detail)


def stop_process(proc: subprocess.Popen[Any], first: int = signal.SIGTERM) -> int | None:
    """Stop ``proc`` (a session leader) and what is left of its process group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            os.kill(proc.pid, first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return proc.returncode


def parse_prom(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus text -> {name: {sorted label pairs: value}}; every line must parse."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.split("\n"):  # the format's only line break (a label may hold a \r)
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        assert m is not None, f"not a Prometheus sample line: {line!r}"
        labels = tuple(sorted(_PROM_LABEL.findall(m.group(3) or "")))
        value = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}.get(m.group(4))
        out.setdefault(m.group(1), {})[labels] = float(m.group(4)) if value is None else value
    return out


class Serve:
    """`rankwatch serve` on fixed ports (so a restart finds them again)."""

    def __init__(
        self,
        data: Path,
        log: Path,
        *,
        extra: Sequence[str] = (),
        port: int | None = None,
        ingest_port: int | None = None,
        ingest_host: str = HOST,
        token: str | None = None,
        env: dict[str, str] | None = None,
        host: str | None = HOST,
        verbose: int = 0,
    ) -> None:
        self.data, self.log = data, log
        self.verbose = verbose
        self.port = port or free_port()
        self.ingest_port = ingest_port or free_port()
        self.ingest_host = ingest_host
        self.token = token
        self.extra = list(extra)
        self.host = host
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def addr(self) -> str:
        return f"{HOST if self.ingest_host in ('*', '0.0.0.0') else self.ingest_host}:" + str(
            self.ingest_port
        )

    def command(self) -> list[str]:
        cmd = [*SERVE, *["-v"] * self.verbose, "serve", "--data", str(self.data)]
        cmd += ["--port", str(self.port)]
        cmd += ["--ingest-host", self.ingest_host, "--ingest-port", str(self.ingest_port)]
        if self.host is not None:
            cmd += ["--host", self.host]
        return [*cmd, *self.extra]

    def start(self, wait: bool = True) -> Serve:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )  # fmt: skip
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        def answers() -> bool:
            self.check_alive()
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(f"serve to answer on {self.url}", answers, READY_TIMEOUT_S, 0.2)

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited ({self.proc.returncode}):\n{self.tail()}")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def request(self, path: str, timeout: float = 10.0, **params: Any) -> httpx.Response:
        try:
            res = httpx.get(self.url + path, params=params, headers=self.headers(), timeout=timeout)
        except httpx.TransportError:
            self.check_alive()  # a dead serve explains itself with its exit code and log
            raise
        res.raise_for_status()
        return res

    def get(self, path: str, timeout: float = 10.0, **params: Any) -> Any:
        return self.request(path, timeout, **params).json()

    def metrics(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        return parse_prom(self.request("/metrics", 30).text)

    def counter(self, name: str, **labels: str) -> float:
        family = self.metrics().get(f"rankwatch_aggregator_{name}", {})
        return family.get(tuple(sorted(labels.items())), 0.0)

    def run_entry(self, run: str) -> dict[str, Any] | None:
        for entry in self.get("/api/status").get("runs") or []:
            if entry.get("run") == run:
                return dict(entry)
        return None

    def rank_states(self, run: str) -> dict[int, str]:
        entry = self.run_entry(run) or {}
        return {row["rank"]: row["state"] for row in entry.get("ranks") or []}

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> int | None:
        return None if self.proc is None else stop_process(self.proc)


class Rank:
    """A ``rank_proc.py`` process; its output goes to ``<log_dir>/rank<k>.out``."""

    def __init__(
        self,
        run: str,
        rank: int,
        world: int,
        addr: str,
        log_dir: Path,
        *,
        steps: int = 1_000_000,
        interval: float = 0.02,
        heartbeat: float = 0.5,
        stop_file: Path | None = None,
        prefix: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.rank, self.log_dir = rank, log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out = log_dir.parent / f"{log_dir.name}-{run.replace('/', '_')[:40]}-rank{rank}.out"
        cmd = [
            *prefix, sys.executable, str(RANK_SCRIPT), "--run", run, "--rank", str(rank),
            "--world", str(world), "--addr", addr, "--log-dir", str(log_dir),
            "--steps", str(steps), "--interval", str(interval), "--heartbeat", str(heartbeat),
        ]  # fmt: skip
        if stop_file is not None:
            cmd += ["--stop-file", str(stop_file)]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH_")}
        # records are compared one for one with the store: telemetry has tests of its own
        full_env.update(PYTHONUNBUFFERED="1", RANKWATCH_TELEMETRY="off", **(env or {}))
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env=full_env,
            )  # fmt: skip

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self, timeout_s: float = 60.0) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> int | None:
        return stop_process(self.proc)


# --- what the ranks wrote and what the aggregator stored ------------------------------------


def canonical(record: records.Record) -> str:
    """A record as sorted JSON: NaN equals NaN, map order does not matter."""
    line = json.loads(records.to_json_line(record))
    line.pop("v", None)
    return json.dumps(line, sort_keys=True)


def read_jsonl(run_dir: Path) -> dict[tuple[int, int], str]:
    """(rank, seq) -> canonical record, for every ``rank*.jsonl`` in ``run_dir``."""
    out: dict[tuple[int, int], str] = {}
    for path in sorted(run_dir.glob("rank*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = records.from_json_line(line)
                out[(rec.rank, rec.seq)] = canonical(rec)
    return out


def read_store(data: Path, run: str) -> dict[tuple[int, int], str]:
    """(rank, seq) -> canonical record stored for ``run`` (serve must have stopped)."""
    from rankwatch.aggregator.store.db import Store

    with Store(data) as store:
        return {(rec.rank, rec.seq): canonical(rec) for rec in store.records(run)}


def compare(stored: dict[Any, str], written: dict[Any, str]) -> dict[str, int]:
    """Counts of missing, extra and differing records (stored vs written)."""
    missing = set(written) - set(stored)
    extra = set(stored) - set(written)
    differ = [k for k in set(written) & set(stored) if written[k] != stored[k]]
    return {"written": len(written), "missing": len(missing), "extra": len(extra),
            "differ": len(differ)}  # fmt: skip


class Stream:
    """Reads ``GET /api/stream`` in a thread and keeps the highest step seen per rank."""

    def __init__(self, serve: Serve, run: str) -> None:
        self.url = f"{serve.url}/api/stream"
        self.params = {"run": run}
        self.headers = serve.headers()
        self.frames = 0
        self.top: dict[int, int] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        timeout = httpx.Timeout(10.0, read=30.0)
        try:
            with httpx.stream("GET", self.url, params=self.params, headers=self.headers,
                              timeout=timeout) as res:  # fmt: skip
                res.raise_for_status()
                event = ""
                for line in res.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "feed":
                        self._feed(json.loads(line[6:]))
        except BaseException as exc:  # reported by the test that reads it
            if not self._stop.is_set():
                self.error = exc

    def _feed(self, messages: list[dict[str, Any]]) -> None:
        self.frames += 1
        for msg in messages:
            if msg.get("type") == "points":
                for rank, step, _ in msg["points"]:
                    self.top[rank] = max(step, self.top.get(rank, step))

    def highest(self) -> int:
        return min(self.top.values(), default=0)

    def close(self) -> None:
        self._stop.set()
