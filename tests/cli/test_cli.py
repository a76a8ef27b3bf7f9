"""The real `rankwatch` console script, run in subprocesses."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import StepRecord

from tests import polling
from tests.cli.running import RANKWATCH, Server, cli, free_port, wait_until


def step(rank: int, s: int, run: str = "cli", loss: float | None = None) -> StepRecord:
    value = (
        loss if loss is not None else 1.0 / s + 0.01 * rank + (2.0 if rank == 2 and s >= 10 else 0)
    )
    return StepRecord(
        run=run, rank=rank, seq=s, time=time.time(), world_size=4, host="h", pid=rank + 1,
        step=s, epoch=None, metrics={"loss": value},
    )  # fmt: skip


def test_help_lists_every_subcommand() -> None:
    result = cli("--help")
    assert result.returncode == 0
    for name in ("serve", "status", "import", "export", "demo"):
        assert name in result.stdout


def test_serve_status_and_import_over_http(servers: Callable[..., Server], tmp_path: Path) -> None:
    server = servers(tmp_path / "data")
    assert f'Monitor(addr="127.0.0.1:{server.ingest_port}")' in server.banner
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in range(4)]
    try:
        for sock in socks:
            sock.connect(f"tcp://127.0.0.1:{server.ingest_port}")
        for s in range(1, 31):
            for rank, sock in enumerate(socks):
                sock.send(records.encode_frame([step(rank, s)]))

        def flagged() -> Any:
            runs = server.status()["runs"]
            return runs and runs[0]["ranks"][2]["divergent"] and runs[0]["last_step"] == 30

        wait_until(flagged)
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()
    (run,) = server.status()["runs"]
    assert run["run"] == "cli" and run["state"] == "running"
    assert [r["rank"] for r in run["ranks"]] == [0, 1, 2, 3]
    assert [r["divergent"] for r in run["ranks"]] == [[], [], ["loss"], []]
    assert all(r["state"] == "alive" for r in run["ranks"])

    table = cli("status", "--url", server.url)
    assert table.returncode == 0
    assert "run cli  [running]  world size 4  last step 30" in table.stdout
    assert "loss (z=" in table.stdout
    assert cli("status", "--url", server.url, "--run", "nope").returncode == 1

    # Import a JSONL file of another run through the server, twice: the second is all duplicates.
    jsonl = tmp_path / "other" / "rank0.jsonl"
    jsonl.parent.mkdir()
    lines = [records.to_json_line(step(0, s, run="imported", loss=0.5)) for s in range(1, 21)]
    jsonl.write_text("".join(lines) + "not json\n")
    first = cli("import", str(jsonl.parent), "--url", server.url)
    assert first.returncode == 1  # one bad line is reported
    assert (
        f"{jsonl}: 21 lines read, 20 records stored, 0 already stored, 1 rejected "
        "(first at line 21: not a JSON line"
    ) in first.stdout
    second = cli("import", str(jsonl), "--url", server.url)
    assert "21 lines read, 0 records stored, 20 already stored, 1 rejected" in second.stdout
    imported = server.status("--run", "imported")["runs"]
    assert imported[0]["last_step"] == 20
    assert server.stop() == 0


AGENT = textwrap.dedent(
    """
    import os, sys, time
    from rankwatch.agent.monitor import Monitor

    port, log_dir, steps, restarted = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    mon = Monitor(run="survivor", rank=0, world_size=1, addr=f"127.0.0.1:{port}",
                  log_dir=log_dir, heartbeat_s=0.5)

    def wait_for(path):
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)

    for s in range(1, steps + 1):
        if s == steps - 50:  # the last steps go to the restarted aggregator, however slow
            wait_for(restarted)
        mon.log(s, loss=1.0 / s)
        time.sleep(0.02)
    # close() gives the sender a bounded time and the agent's reconnect backs off to seconds
    # after a long outage: exiting at once can leave the tail only in the JSONL. Resends also
    # need a live agent, so it stays until the restarted aggregator holds every step.
    wait_for(restarted + ".drained")
    mon.close()
    """
)


def test_kill_9_then_restart_loses_nothing_and_the_agent_reconnects(
    servers: Callable[..., Server], tmp_path: Path
) -> None:
    port = free_port()
    data = tmp_path / "data"
    first = servers(data, ingest_port=port)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    steps = 400  # about 8 s of logging, across the kill and the restart
    restarted = tmp_path / "restarted"
    agent = subprocess.Popen(
        [sys.executable, str(script), str(port), str(tmp_path / "logs"), str(steps), str(restarted)]
    )
    try:
        wait_until(lambda: (r := first.status()["runs"]) and r[0]["last_step"] >= 60)
        wait_until(lambda: _records_stored(first, "survivor") >= 60, 30)  # flushed to the disk
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        before = _stored_steps(data, tmp_path / "before.csv")
        assert len(before) >= 50  # what was flushed survived the kill
        second = servers(data, ingest_port=port)
        restarted.touch()

        def drained() -> bool:  # records lost in flight are asked for again (from the JSONL)
            run = (second.status()["runs"] or [{}])[0]
            return run.get("last_step") == steps and run["ranks"][0]["gaps"] == []

        polling.wait_until(drained, 90, 0.1, "every step on the restarted serve",
                           lambda: second.status()["runs"])  # fmt: skip
        restarted.with_name("restarted.drained").touch()
        assert agent.wait(30) == 0
        wait_until(lambda: (r := second.status()["runs"]) and r[0]["state"] == "finished")
        assert second.stop() == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    after = _stored_steps(data, tmp_path / "after.csv")
    assert after == list(range(1, steps + 1))
    assert before == after[: len(before)]


def _records_stored(server: Server, run: str) -> int:
    with urllib.request.urlopen(f"{server.url}/api/runs", timeout=10) as response:
        runs = json.load(response).get("runs") or []
    return next((r.get("records") or 0 for r in runs if r.get("run") == run), 0)


def _stored_steps(data: Path, out: Path) -> list[int]:
    result = cli("export", "--run", "survivor", "--out", str(out), "--data", str(data))
    assert result.returncode == 0, result.stderr
    with out.open() as f:
        return sorted(int(row["step"]) for row in csv.DictReader(f) if row["metric"] == "loss")


def test_import_into_a_data_dir_then_export(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "job"
    logs.mkdir(parents=True)
    for rank in range(2):
        recs = [
            step(rank, s, run="job", loss=float("nan") if s == 3 else s / 10) for s in range(1, 6)
        ]
        (logs / f"rank{rank}.jsonl").write_text("".join(records.to_json_line(r) for r in recs))
    data = tmp_path / "data"
    result = cli("import", str(tmp_path / "logs"), "--data", str(data))
    assert result.returncode == 0, result.stderr
    assert "imported 10 new records from 2 file(s), 0 duplicates" in result.stdout
    again = cli("import", str(tmp_path / "logs"), "--data", str(data))
    assert "imported 0 new records from 2 file(s), 10 duplicates" in again.stdout

    out = tmp_path / "job.csv"
    exported = cli("export", "--run", "job", "--out", str(out), "--data", str(data))
    assert exported.returncode == 0, exported.stderr
    assert "wrote 10 rows" in exported.stdout
    with out.open() as f:
        rows = list(csv.DictReader(f))
    values = {(int(r["rank"]), int(r["step"])): float(r["value"]) for r in rows}
    assert math.isnan(values[(1, 3)]) and values[(0, 5)] == 0.5

    parquet = tmp_path / "job.parquet"
    assert cli("export", "--run", "job", "--out", str(parquet), "--data", str(data)).returncode == 0
    assert parquet.read_bytes()[:4] == b"PAR1"

    missing = cli("export", "--run", "nope", "--out", str(out), "--data", str(data))
    assert missing.returncode == 2 and "no run named 'nope'" in missing.stderr
    assert "'job'" in missing.stderr
    nostore = cli("export", "--run", "job", "--out", str(out), "--data", str(tmp_path / "none"))
    assert nostore.returncode == 2 and "no store at" in nostore.stderr
    assert not (tmp_path / "none").exists()


def test_clear_errors(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[serve]\nprot = 1\n")
    result = cli("serve", "--config", str(config), "--data", str(tmp_path / "d"))
    assert result.returncode == 2
    assert f"{config}: unknown key 'serve.prot'" in result.stderr
    bad_hook = cli("serve", "--webhook", "teams=https://x.y/z", "--data", str(tmp_path / "d"))
    assert bad_hook.returncode == 2 and "unknown webhook kind 'teams'" in bad_hook.stderr
    down = cli("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2 and "cannot reach rankwatch" in down.stderr
    absent = cli("import", str(tmp_path / "nothing.jsonl"), "--data", str(tmp_path / "d"))
    assert absent.returncode == 2 and "nothing.jsonl" in absent.stderr


def test_busy_ports_and_a_token(servers: Callable[..., Server], tmp_path: Path) -> None:
    server = servers(tmp_path / "a", "--token", "t0ken")
    clash = cli("serve", "--data", str(tmp_path / "b"), "--port", "0",
                "--ingest-host", "127.0.0.1", "--ingest-port", str(server.ingest_port))  # fmt: skip
    assert clash.returncode == 2 and f"127.0.0.1:{server.ingest_port}" in clash.stderr
    denied = cli("status", "--url", server.url)
    assert denied.returncode == 2 and "--token" in denied.stderr
    allowed = cli("status", "--url", server.url, "--token", "t0ken", "--json")
    assert allowed.returncode == 0 and json.loads(allowed.stdout)["runs"] == []
    env = {**os.environ, "RANKWATCH_TOKEN": "t0ken"}
    from_env = subprocess.run(
        [RANKWATCH, "status", "--url", server.url], capture_output=True, text=True, env=env,
        timeout=60, check=False,
    )  # fmt: skip
    assert from_env.returncode == 0 and "no runs yet" in from_env.stdout
