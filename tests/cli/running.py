"""The real `rankwatch` console script in subprocesses: a server on free ports, and a runner."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests import polling

RANKWATCH = str(Path(sys.executable).parent / "rankwatch")
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RANKWATCH, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


class Server:
    """`rankwatch serve` on free ports; the banner tells where it listens."""

    def __init__(self, data: Path, *extra: str, ingest_port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [RANKWATCH, "serve", "--data", str(data), "--port", "0",
             "--ingest-host", "127.0.0.1", "--ingest-port", str(ingest_port), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.banner = ""
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.proc.stdout is not None
        while "mon.log" not in self.banner:
            line = self.proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"serve did not start: {self.banner}{self.stderr()}")
            self.banner += line
        self.url = re.search(r"http://[\d.]+:\d+", self.banner).group(0)  # type: ignore[union-attr]
        self.ingest_port = int(re.search(r"tcp://[^:]+:(\d+)", self.banner).group(1))  # type: ignore[union-attr]

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    def status(self, *args: str) -> Any:
        result = cli("status", "--url", self.url, "--json", *args)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def wait_until(predicate: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    return polling.wait_until(predicate, timeout_s, every_s=0.1)
