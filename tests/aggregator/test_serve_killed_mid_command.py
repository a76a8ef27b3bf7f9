"""The aggregator dies between a command and its acknowledgement, with real processes: a real
`rankwatch serve` with a store folder, a real Monitor rank over loopback ZeroMQ, a stop asked
over HTTP with the token, serve killed (SIGKILL) after the rank was told "go" and before it
reached the step, and serve started again on the same store and ports. The command is shown
as received and not done; the rank stops once, at the agreed step; its answer lands on the
stored command; the new serve re-sends nothing and nothing is counted as unknown or replayed.
The stop is pressed on the incident of the rank's NaN, so its outcome is one ``[ACTION]``
message, told by the new serve (which has the incident only in the store)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from rankwatch.agent.monitor import Monitor

RUN = "killed-mid-command"
TOKEN = "mid-command-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAUSE_AT = 5  # the rank logs this many steps, then waits for the test
OUTCOME = f"rankwatch [ACTION] {RUN}: "  # the console's outcome line (not the desk's log)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    def __init__(self, data: Path, port: int, ingest: int) -> None:
        cmd = [sys.executable, "-m", "rankwatch.cli", "serve", "--data", str(data),
               "--host", "127.0.0.1", "--port", str(port), "--ingest-host", "127.0.0.1",
               "--ingest-port", str(ingest), "--token", TOKEN]  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.path = data.parent / f"serve-{time.monotonic_ns()}.log"
        self.log = open(self.path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait("serve answers", lambda: self._healthy(), 30)

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, Path(self.log.name).read_text()[-3000:]
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str) -> Any:
        res = httpx.get(f"{self.url}{path}", params={"run": RUN}, headers=AUTH, timeout=5)
        res.raise_for_status()
        return res.text if path == "/metrics" else res.json()

    def command(self, ident: str) -> dict[str, Any] | None:
        return next((c for c in self.get("/api/run/commands")["commands"] if c["id"] == ident),
                    None)  # fmt: skip

    def counter(self, name: str) -> float:
        for line in self.get("/metrics").splitlines():
            if line.startswith(f"rankwatch_aggregator_{name} "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no counter {name}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        self.log.close()


def wait(what: str, cond: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


class Rank(threading.Thread):
    def __init__(self, ingest: int, log_dir: Path) -> None:
        super().__init__(daemon=True)
        self.mon = Monitor(run=RUN, rank=0, world_size=1, addr=f"tcp://127.0.0.1:{ingest}",
                           log_dir=log_dir, accept=("stop",), heartbeat_s=0.5)  # fmt: skip
        self.resume = threading.Event()
        self.leave = threading.Event()  # a rank that exits at once takes its unsent answer
        # with it (it stays in the JSONL, for `rankwatch import`): this one waits to be told
        self.stopped: list[int] = []

    def run(self) -> None:
        for step in range(1, 200):
            if step > PAUSE_AT:
                self.resume.wait(30)
            self.mon.log(step, loss=float("nan") if step == PAUSE_AT else 1.0 / step)
            if self.mon.should_stop(step):
                self.stopped.append(step)
                break
            time.sleep(0.05)
        self.leave.wait(30)
        self.mon.close()

    def told_go(self, ident: str) -> bool:
        commands = self.mon.commands
        due = commands._due.get(ident) if commands is not None else None  # the rank's own view
        return due is not None and due.go


def ranks_at(serve: Serve) -> int | None:
    ranks = serve.get("/api/run/ranks")["ranks"]
    return ranks[0].get("last_step") if ranks else None


def test_serve_killed_after_go_and_before_the_answer(tmp_path: Path) -> None:
    data, port, ingest = tmp_path / "data", free_port(), free_port()
    serve = Serve(data, port, ingest)
    rank = Rank(ingest, tmp_path / "logs")
    again: Serve | None = None
    try:
        rank.start()
        wait("the rank's steps", lambda: ranks_at(serve) == PAUSE_AT)
        (incident,) = wait("the NaN's incident", lambda: serve.get(f"/api/runs/{RUN}/incidents")[
            "incidents"])  # fmt: skip
        res = httpx.post(f"{serve.url}/api/run/commands", params={"run": RUN}, headers=AUTH,
                         json={"cmd": "stop", "reason": "test", "incident": incident["id"]},
                         timeout=5)  # fmt: skip
        assert res.status_code == 200, res.text
        stop = res.json()
        assert stop["step"] > PAUSE_AT
        wait("the rank told go", lambda: rank.told_go(stop["id"]))
        told = time.time()
        # the store holds the command as received: a heartbeat made after "go" is stored, and
        # one flush writes the records and the commands buffered before them
        wait("a flush after go", lambda: any(
            r["run"] == RUN and (r.get("record_time") or 0) > told + 0.1
            for r in serve.get("/api/runs")["runs"]))  # fmt: skip
        serve.kill()
        again = Serve(data, port, ingest)
        shown = again.command(stop["id"])
        assert shown is not None and shown["acks"]["0"]["state"] == "received"
        assert shown["state"] == "waiting" and shown["phase"] == "go"
        assert rank.stopped == []  # it has not reached the step
        rank.resume.set()
        wait("the rank's stop", lambda: rank.stopped)
        done = wait("the answer on the new serve", lambda: (
            (c := again.command(stop["id"])) and c["state"] == "done" and c))  # fmt: skip
        assert done["acks"]["0"]["at"] == stop["step"]
        wait("the outcome message", lambda: OUTCOME in again.path.read_text())
        assert done["incident"] == incident["id"]
        rank.leave.set()
        rank.join(10)
        assert rank.stopped == [stop["step"]]  # once, at the agreed step
        assert [c["id"] for c in again.get("/api/run/commands")["commands"]] == [stop["id"]]
        # the new serve re-sent nothing (a repeat would be answered "replayed"), issued nothing
        for name, want in [("commands_sends", 0), ("commands_send_failed", 0),
                           ("commands_issued", 0), ("command_acks_unknown", 0),
                           ("command_acks_replayed", 0), ("command_acks", 1)]:  # fmt: skip
            assert again.counter(name) == want, name
        counts = rank.mon.commands.counts if rank.mon.commands else {}
        assert counts["received"] == 1 and counts["done"] == 1 and counts["replayed"] == 0
        acks = [json.loads(line) for f in (tmp_path / "logs").rglob("*.jsonl")
                for line in f.read_text().splitlines() if '"command"' in line]  # fmt: skip
        states = [a["info"]["state"] for a in acks if a.get("event") == "command"]
        assert states == ["received", "done"]
        again.stop()  # tells what it still holds: every message it would send is out
        (outcome,) = [line for line in again.path.read_text().splitlines() if OUTCOME in line]
        assert "1/1 acknowledged, done" in outcome, outcome
        assert OUTCOME not in serve.path.read_text()  # the first serve had nothing to tell
    finally:
        rank.resume.set()
        rank.leave.set()
        rank.join(10)
        serve.stop()
        if again is not None:
            again.stop()
