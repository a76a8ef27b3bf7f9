"""A real ``rankwatch serve`` in a child process, for the load benchmarks and the CI load test.

Binds the dashboard and the ingest port on 127.0.0.1 (any free port) and reads both from the
banner. Process CPU time and RSS come from ``/proc/<pid>`` (Linux), so measuring costs the
aggregator nothing; counters come from ``GET /metrics`` (which does cost it a snapshot).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BANNER_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
COUNTER = re.compile(r"^rankwatch_aggregator_(\w+) ([0-9.eE+-]+)$")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def proc_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class ServeProc:
    """``rankwatch serve`` with its data in ``data_dir``; a context manager that stops it."""

    def __init__(self, data_dir: Path, extra: Sequence[str] = ()) -> None:
        cmd = [
            sys.executable, "-c", "from rankwatch.cli.main import main; main()", "serve",
            "--data", str(data_dir), "--host", "127.0.0.1", "--port", "0",
            "--ingest-host", "127.0.0.1", "--ingest-port", "0", *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.pid = self.proc.pid
        self.lines: deque[str] = deque(maxlen=2000)
        self.http_port = self.ingest_port = 0
        found = threading.Event()
        threading.Thread(target=self._read, args=(found,), daemon=True).start()
        if not found.wait(BANNER_TIMEOUT_S) or not self.ingest_port:
            self.stop()
            raise RuntimeError("rankwatch serve did not start:\n" + "\n".join(self.lines))
        self.addr = f"tcp://127.0.0.1:{self.ingest_port}"

    def _read(self, found: threading.Event) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if m := re.search(r"dashboard http://[^:]+:(\d+)/", line):
                self.http_port = int(m.group(1))
            if m := re.search(r"agents connect to tcp://\S+:(\d+)", line):
                self.ingest_port = int(m.group(1))
                found.set()
        found.set()  # exited: let the constructor fail fast

    def __enter__(self) -> ServeProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)

    def rss_bytes(self) -> int:
        return proc_rss_bytes(self.pid)

    def get(self, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=HTTP_TIMEOUT_S)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
        finally:
            conn.close()
        return body.decode() if path == "/metrics" else json.loads(body)

    def counters(self) -> dict[str, float]:
        """The aggregator's unlabelled counters (``records_accepted``, ``merge_late`` ...)."""
        out: dict[str, float] = {}
        for line in self.get("/metrics").splitlines():
            if m := COUNTER.match(line):
                out[m.group(1)] = float(m.group(2))
        return out

    def stored(self, run: str) -> int:
        """Records of ``run`` in the store (flushed)."""
        for entry in self.get("/api/runs")["runs"]:
            if entry["run"] == run:
                return int(entry.get("records") or 0)
        return 0

    def wait_idle(self, timeout_s: float, busy_share: float = 0.1, window_s: float = 1.0) -> float:
        """Wait until the process uses under ``busy_share`` of a core over ``window_s``
        (its backlog is drained); returns the seconds waited. Reads only /proc."""
        t0 = time.monotonic()
        before = self.cpu_s()
        while time.monotonic() - t0 < timeout_s:
            time.sleep(window_s)
            now = self.cpu_s()
            if now - before < busy_share * window_s:
                break
            before = now
        return time.monotonic() - t0

    def stream(self, timeout_s: float = HTTP_TIMEOUT_S) -> Iterator[tuple[str, str]]:
        """``GET /api/stream``: yields (event, data) as they arrive (Server-Sent Events)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout_s)
        conn.request("GET", "/api/stream")
        resp = conn.getresponse()
        event, data = "message", ""
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                text = line.decode().rstrip("\n")
                if not text:
                    if data:
                        yield event, data
                    event, data = "message", ""
                elif text.startswith("event: "):
                    event = text[7:]
                elif text.startswith("data: "):
                    data += text[6:]
        finally:
            conn.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
