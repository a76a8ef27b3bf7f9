"""Stored runs through the real console script: `rankwatch import`, then `rankwatch serve` over
the store (as after a restart), `rankwatch status` and `rankwatch export --url` against it."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

from tests.cli.running import RANKWATCH, Server, cli

DAY_S = 86_400.0


def legacy_logs(folder: Path, model: str, t0: float, end: bool) -> None:
    """The old callback's per-rank files: steps with timestamps, a last train_end line."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        lines = [
            json.dumps({"step": s, "epoch": 0, "loss": 1.0 / s, "timestamp": t0 + s})
            for s in range(1, 6)
        ]
        if end:
            lines.append(json.dumps({"event": "train_end", "step": -1}))
        (folder / f"{model}_rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def test_status_and_export_of_stored_runs_through_a_running_serve(
    servers: Callable[..., Server], tmp_path: Path
) -> None:
    t0 = time.time() - DAY_S
    legacy_logs(tmp_path / "logs", "gpt", t0, end=True)
    legacy_logs(tmp_path / "logs", "bert", t0 + 3600, end=False)
    data = tmp_path / "data"
    imported = cli("import", str(tmp_path / "logs"), "--data", str(data))
    assert imported.returncode == 0, imported.stderr

    server = servers(data)
    status = cli("status", "--url", server.url)
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert "no runs yet" not in text
    # newest first; the records' own time (a day ago), not the import's
    assert text.index("run bert  [ended, stored]") < text.index("run gpt  [finished, stored]")
    assert "run gpt  [finished, stored]  world size 2  last step 5  last record 24.0h ago" in text
    assert "2 of 2 ranks sent no end or crash event: finished, killed or cut off" in text
    states = [(r["run"], r["state"]) for r in server.status()["runs"]]
    assert states == [("bert", "ended"), ("gpt", "finished")]
    listed = json.loads(cli("status", "--url", server.url, "--json", "--run", "gpt").stdout)
    assert [r["run"] for r in listed["runs"]] == ["gpt"]

    out = tmp_path / "gpt.csv"
    exported = cli("export", "--run", "gpt", "--url", server.url, "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.startswith(f"wrote 10 rows of run 'gpt' to {out} (through {server.url}")
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert {(int(r["rank"]), int(r["step"])) for r in rows} == {
        (rank, s) for rank in range(2) for s in range(1, 6)
    }
    assert {r["metric"] for r in rows} == {"loss"}
    parquet = tmp_path / "gpt.parquet"
    as_parquet = cli("export", "--run", "gpt", "--url", server.url, "--out", str(parquet))
    assert as_parquet.returncode == 0, as_parquet.stderr
    with duckdb.connect() as con:
        count = con.execute(f"SELECT count(*), min(step) FROM '{parquet}'").fetchone()
    assert count == (10, 1)
    hive = tmp_path / "lake"
    for run in ("gpt", "bert"):
        laid = cli(
            "export", "--run", run, "--url", server.url, "--format", "hive", "--out", str(hive)
        )
        assert laid.returncode == 0, laid.stderr
        assert laid.stdout == (
            f"wrote 10 rows of run {run!r} to {hive}/run=.../rank=.../ (through {server.url})\n"
        )
    assert sorted(p.parent.relative_to(hive).as_posix() for p in hive.rglob("*.parquet")) == [
        f"run={run}/rank={rank}" for run in ("bert", "gpt") for rank in (0, 1)
    ]
    with duckdb.connect() as con:
        by_rank = con.execute(
            f"SELECT run, rank, count(*) FROM read_parquet('{hive}/**/*.parquet', "
            "hive_partitioning = true) GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    assert by_rank == [("bert", 0, 5), ("bert", 1, 5), ("gpt", 0, 5), ("gpt", 1, 5)]
    twice = cli(
        "export", "--run", "gpt", "--url", server.url, "--format", "hive", "--out", str(hive)
    )
    assert twice.returncode == 2
    assert twice.stderr == (
        f"rankwatch export: {hive} already holds run 'gpt': remove its run= folder or choose "
        "another --out\n"
    )
    assert not list(tmp_path.glob(".lake.*"))  # the staged file is gone either way
    unknown = cli("export", "--run", "nope", "--url", server.url, "--out", str(out))
    assert unknown.returncode == 2
    assert f"HTTP 404: unknown run 'nope' (`rankwatch status --url {server.url}` lists" in (
        unknown.stderr
    )
    assert not (tmp_path / "gpt.csv.part").exists()

    locked = cli("export", "--run", "gpt", "--data", str(data), "--out", str(tmp_path / "x.csv"))
    assert locked.returncode == 2
    assert locked.stderr.startswith(
        f"rankwatch export: a serve is running on this store ({data}): use --url http://HOST:PORT"
    )
    assert locked.stderr.count("\n") == 1  # one line

    # a restarted serve over the same store lists the same runs the same way
    assert server.stop() == 0
    again = servers(data)
    restarted = again.status()
    assert [(r["run"], r["state"]) for r in restarted["runs"]] == [
        ("bert", "ended"), ("gpt", "finished"),
    ]  # fmt: skip
    page = json.loads(cli_get(again.url + "/api/runs"))
    assert [(r["run"], r["final_state"]) for r in page["runs"]] == [
        ("bert", "ended"), ("gpt", "finished"),
    ]  # fmt: skip


def cli_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def test_status_compares_a_run_with_the_previous_run_of_its_job(
    servers: Callable[..., Server], tmp_path: Path
) -> None:
    t0 = time.time() - 2 * DAY_S
    data = tmp_path / "data"
    for name, t, scale in (("train-20261130-2130-aaaaaa", t0, 2.0),
                           ("train-20261201-2130-bbbbbb", t0 + DAY_S, 1.0)):  # fmt: skip
        logs = tmp_path / name
        logs.mkdir()
        for rank in range(2):
            lines = [
                json.dumps({"step": s, "loss": scale / s, "lr": 0.1, "timestamp": t + s})
                for s in range(1, 21)
            ]
            (logs / f"m_rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
        result = cli("import", str(logs), "--data", str(data), "--run", name)
        assert result.returncode == 0, result.stderr
    server = servers(data)
    newer = "train-20261201-2130-bbbbbb"
    shown = cli("status", "--url", server.url, "--run", newer, "--compare")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == (
        f"run {newer} vs train-20261130-2130-aaaaaa (the previous run of job 'train'): "
        "median across ranks at the same step"
    )
    loss = [line.split() for line in lines if line.strip().startswith("loss")]
    assert [row[1] for row in loss] == ["1", "7", "14", "20"]  # evenly spaced, then the last
    assert loss[-1] == ["loss", "20", "(last)", "0.05", "0.1", "0.500"]
    answer = json.loads(
        cli("status", "--url", server.url, "--run", newer, "--compare", "--json").stdout
    )
    assert {m["metric"] for m in answer["metrics"]} == {"loss", "lr"}
    assert answer["ref_reason"] == "the previous run of job 'train'"
    first = "train-20261130-2130-aaaaaa"
    alone = cli("status", "--url", server.url, "--run", first, "--compare")
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines()[-1] == (
        f"rankwatch status: run '{first}' has no earlier run of the same job to compare with "
        "(name one: --compare RUN)"
    )
    alone_json = cli("status", "--url", server.url, "--run", first, "--compare", "--json")
    assert alone_json.returncode == 2 and json.loads(alone_json.stdout)["ref"] is None
    given = cli("status", "--url", server.url, "--run", first, "--compare", newer)
    assert given.returncode == 0 and f"run {first} vs {newer}: median" in given.stdout
    unknown = cli("status", "--url", server.url, "--run", first, "--compare", "nope")
    assert unknown.returncode == 2 and "unknown run 'nope'" in unknown.stderr


def test_the_demo_banner_export_commands_work_as_printed(
    servers: Callable[..., Server], tmp_path: Path
) -> None:
    from rankwatch.demo.launcher import export_lines

    run = "demo-20261201-205000"
    data = tmp_path / "rankwatch data" / "demo"  # a space: the commands are quoted
    legacy_logs(tmp_path / "logs", "m", time.time() - DAY_S, end=True)
    assert cli("import", str(tmp_path / "logs"), "--data", str(data), "--run", run).returncode == 0
    server = servers(data)
    running, stopped = export_lines(run, server.url, data)
    assert running.startswith(f"  export:     rankwatch export --run {run} --url {server.url}")
    assert "once stopped: rankwatch export" in stopped

    def command(line: str) -> list[str]:
        words = shlex.split(line.split("rankwatch export", 1)[1].rstrip(")"))
        return [RANKWATCH, "export", *words]

    live = subprocess.run(command(running), cwd=tmp_path, capture_output=True, text=True)
    assert live.returncode == 0, live.stderr
    assert live.stdout.startswith(f"wrote 10 rows of run '{run}' to {run}.csv")
    (tmp_path / f"{run}.csv").unlink()
    assert server.stop() == 0
    later = subprocess.run(command(stopped), cwd=tmp_path, capture_output=True, text=True)
    assert later.returncode == 0, later.stderr
    assert (tmp_path / f"{run}.csv").read_text().startswith("run,rank,step,epoch,time,metric")
