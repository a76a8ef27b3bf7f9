"""Child processes of the demo, and stopping every one of them.

Each child starts in its own session (so a Ctrl-C in the terminal reaches the demo alone and the
demo decides the order of shutdown) and carries a token in its environment. msrun starts its
workers with ``setsid`` and they leave msrun's process group, so after stopping the groups we
know, a sweep of ``/proc`` for the token finds any descendant that escaped and kills it by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TOKEN_ENV = "RANKWATCH_DEMO_TOKEN"
POLL_S = 0.1  # how often stop() looks whether a process has exited
SWEEP_ROUNDS = 20  # /proc sweeps at most (POLL_S apart) until no tokened process is left


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None
    log_file: IO[bytes] | None


class Processes:
    """Starts children, and stops them all (in reverse start order, or as asked)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.children: list[Child] = []

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(extra or {})
        env[TOKEN_ENV] = self.token
        return env

    def spawn(
        self,
        name: str,
        cmd: Sequence[str],
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in a new session; its output goes to ``log_path`` (or is dropped)."""
        log_file: IO[bytes] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            list(cmd),
            env=self.env(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file if log_file else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.children.append(Child(name, proc, log_path, log_file))
        return proc

    def stop(self, proc: subprocess.Popen[bytes], first: signal.Signals, grace_s: float) -> None:
        """Signal ``proc`` with ``first``, then SIGTERM and SIGKILL its process group."""
        for sig, wait_s in ((first, grace_s), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if sig == first:
                    os.kill(proc.pid, sig)  # the leader decides what its group gets
                else:
                    os.killpg(proc.pid, sig)
            _wait(proc, wait_s)
        # The leader is gone; members of its group that outlived it go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._close_log(proc)

    def stop_all(self, grace_s: float = 10.0) -> list[int]:
        """Stop every child (newest first), then sweep; returns the pids the sweep killed."""
        for child in reversed(self.children):
            self.stop(child.proc, signal.SIGINT, grace_s)
        return self.sweep()

    def sweep(self) -> list[int]:
        """Kill, by pid, every process that still carries this demo's token."""
        killed: list[int] = []
        for _ in range(SWEEP_ROUNDS):
            left = tokened_pids(self.token)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(POLL_S)
        for child in self.children:  # reap, so no zombie is left behind either
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=1.0)
        return sorted(set(killed))

    def tail(self, proc: subprocess.Popen[bytes], lines: int = 20) -> str:
        """The last lines of a child's log, to explain a failure."""
        for child in self.children:
            if child.proc is proc and child.log_path and child.log_path.exists():
                text = child.log_path.read_text(encoding="utf-8", errors="replace")
                return "\n".join(text.splitlines()[-lines:])
        return ""

    def _close_log(self, proc: subprocess.Popen[bytes]) -> None:
        for child in self.children:
            if child.proc is proc and child.log_file is not None:
                child.log_file.close()
                child.log_file = None


def tokened_pids(token: str) -> list[int]:
    """Pids of live processes whose environment holds ``TOKEN_ENV=token`` (zombies excluded)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if stat.rsplit(")", 1)[-1].split()[0] != "Z":
            found.append(int(entry.name))
    return found


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)
