"""Fixtures for the hardening tests: process spawning, tmpfs mounts, a result log.

``report(...)`` appends one JSON line per measured fault to the file named by
``RANKWATCH_RELIABILITY_OUT`` (``bench/reliability.py`` sets it and prints the table); without
it the figures only go to the test's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .procs import Rank, Serve

REPORT_ENV = "RANKWATCH_RELIABILITY_OUT"


class Spawner:
    """Starts serves and ranks for one test and stops all of them at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.serves: list[Serve] = []
        self.ranks: list[Rank] = []

    def serve(self, data: Path | None = None, *, wait: bool = True, **kw: Any) -> Serve:
        data = data or self.tmp_path / "data"
        log = kw.pop("log", None) or self.tmp_path / f"serve{len(self.serves)}.log"
        server = Serve(data, log, **kw)
        self.serves.append(server)
        return server.start(wait=wait)

    def restart(self, old: Serve, wait: bool = True) -> Serve:
        """A new serve with the same data dir, ports and flags as ``old``."""
        server = Serve(
            old.data, self.tmp_path / f"serve{len(self.serves)}.log", extra=old.extra,
            port=old.port, ingest_port=old.ingest_port, ingest_host=old.ingest_host,
            token=old.token, env=old.env, host=old.host, verbose=old.verbose,
        )  # fmt: skip
        self.serves.append(server)
        return server.start(wait=wait)

    def rank(self, *args: Any, **kw: Any) -> Rank:
        proc = Rank(*args, **kw)
        self.ranks.append(proc)
        return proc

    def close(self) -> None:
        for rank in self.ranks:
            rank.stop()
        for server in self.serves:
            server.stop()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``report(kind="fault", what=..., result=..., lost=..., **figures)``."""

    def write(**entry: Any) -> None:
        entry.setdefault("test", request.node.name)
        line = json.dumps(entry, sort_keys=True, default=str)
        print(f"reliability: {line}")
        target = os.environ.get(REPORT_ENV)
        if target:
            with open(target, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return write


def need_root(what: str) -> None:
    if sys.platform != "linux":
        pytest.skip(f"{what} is Linux only")
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root (mount, ip netns)")


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """``tmpfs(path, size)`` mounts a small tmpfs on ``path``; unmounted at teardown."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        need_root("mounting a tmpfs")
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            # lazy: a process of the test that outlived its stop must not keep it mounted
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write ``directory/name`` until the filesystem under it is full."""
    path = directory / name
    chunk = b"\0" * (64 * 1024)
    with contextlib.suppress(OSError), open(path, "wb", buffering=0) as f:
        while True:
            f.write(chunk)
    with contextlib.suppress(OSError), open(path, "ab", buffering=0) as f:
        while True:  # the last few blocks
            f.write(b"\0" * 512)
    assert shutil.disk_usage(directory).free < 64 * 1024
    return path
