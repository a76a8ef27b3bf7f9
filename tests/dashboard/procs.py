"""Real processes for the browser tests and bench/freshness.py: `rankwatch serve` and ranks.

Each rank is a ``rank_agent.py`` process driving a real ``Monitor`` that talks ZeroMQ to the
server; the caller sends it JSON lines (see that file) so it controls when each step is logged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
AGENT = Path(__file__).resolve().parent / "rank_agent.py"
# `rankwatch serve`, able to print every thread's stack on SIGUSR1 (see Server.dump_stacks).
_SERVE_MAIN = (
    "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "from rankwatch.cli.main import main; main()"
)
_DASHBOARD = re.compile(r"dashboard (http://\S+?)/")
_INGEST = re.compile(r"agents connect to tcp://(\S+)")


class Server:
    """`rankwatch serve` on free ports with its data in ``data_dir``."""

    def __init__(self, data_dir: Path, token: str | None = None) -> None:
        cmd = [
            sys.executable, "-c", _SERVE_MAIN, "serve",
            "--data", str(data_dir), "--host", "127.0.0.1", "--port", "0",
            "--ingest-host", "127.0.0.1", "--ingest-port", "0",
        ]  # fmt: skip
        if token:
            cmd += ["--token", token]
        self.log_path = data_dir.parent / f"{data_dir.name}-serve.log"
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.url = ""
        self.ingest = ""
        self._lines: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.proc.stdout is not None
        while not (self.url and self.ingest):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"rankwatch serve exited: {''.join(self._lines)[-2000:]}")
            self._lines.append(line)
            if m := _DASHBOARD.search(line):
                self.url = m.group(1)
            if m := _INGEST.search(line):
                self.ingest = m.group(1)
            if time.monotonic() > deadline:
                raise RuntimeError("rankwatch serve did not print its addresses in time")
        # Keep draining its output so a chatty server never blocks on a full pipe.
        self._drainer = threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True)
        self._drainer.start()
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("rankwatch serve does not answer /healthz")
            time.sleep(0.1)

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def get(self, path: str, **params: Any) -> Any:
        res = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        res.raise_for_status()
        return res.json()

    def wait_for(self, what: str, predicate: Any, timeout: float = 30.0) -> Any:
        """Poll until ``predicate()`` returns something truthy; fail saying ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = predicate()
            except httpx.HTTPStatusError:  # e.g. 404 until the first flush stores the run
                value = None
            except httpx.TimeoutException:
                self.dump_stacks()
                raise AssertionError(
                    f"the server stopped answering\n{self.output[-6000:]}"
                ) from None
            if value:
                return value
            if time.monotonic() > deadline:
                self.dump_stacks()
                raise AssertionError(f"timed out waiting for {what}\n{self.output[-6000:]}")
            time.sleep(0.1)

    def dump_stacks(self) -> None:
        """Ask the server for every thread's stack (lands in ``output``): for a hang."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.dump_stacks()
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        if self._drainer.is_alive():
            self._drainer.join(STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log_path.write_text(self.output)


class Rank:
    """One rank's agent process; ``log()`` returns the wall time its Monitor.log() ran."""

    def __init__(self, server: Server, run: str, rank: int, world: int, log_dir: Path) -> None:
        cmd = [
            sys.executable, str(AGENT), "--run", run, "--rank", str(rank), "--world", str(world),
            "--addr", server.ingest, "--log-dir", str(log_dir),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env
        )

    def send(self, command: dict[str, Any]) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")  # NaN/Infinity as bare tokens
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply.startswith("ok "):
            raise RuntimeError(f"rank agent answered {reply!r}")
        return float(reply[3:])

    def log(self, step: int, **metrics: float) -> float:
        return self.send({"step": step, "metrics": metrics})

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write('{"close": true}\n')
                self.proc.stdin.close()
                self.proc.wait(STOP_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
