"""A real 4-rank MindSpore job under msrun, with a real `rankwatch serve` watching it.

From step 20 rank 2's labels are corrupted (the demo's default fault). The aggregator must flag
rank 2, and only rank 2, within 5 steps; every rank's JSONL must equal what the store holds; every
rank must end with an ``end`` event.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rankwatch.agent.wire import records

from .conftest import (
    FlagWatcher,
    Serve,
    assert_store_matches_jsonl,
    events_by_rank,
    free_port,
    launch_env,
    read_jsonl,
    require_msrun,
    run_launcher,
)

pytestmark = [pytest.mark.msrun, pytest.mark.mindspore, pytest.mark.timeout(420)]

TRAIN = Path(__file__).resolve().parents[2] / "demo" / "train_mindspore.py"
RANKS = 4
FAULT_RANK = 2
FAULT_STEP = 20
STEPS = 45
WITHIN_STEPS = 5  # the fault must be flagged by step FAULT_STEP + WITHIN_STEPS
MSRUN_TIMEOUT_S = 300.0


def msrun_command(msrun: str, tmp_path: Path, *train_args: str) -> list[str]:
    return [
        msrun, f"--worker_num={RANKS}", f"--local_worker_num={RANKS}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        f"--log_dir={tmp_path / 'msrun'}", "--join=True", str(TRAIN), *train_args,
    ]  # fmt: skip


def test_bad_rank_flagged_and_store_matches_jsonl(serve: Serve, tmp_path: Path) -> None:
    msrun = require_msrun()
    run = f"e2e-msrun-labels-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(log_dir),
        MS_NODE_TIMEOUT="30",  # a busy machine must not time a healthy rank out
    )
    cmd = msrun_command(
        msrun, tmp_path, "--steps", str(STEPS), "--fault", "labels",
        "--fault-rank", str(FAULT_RANK), "--fault-step", str(FAULT_STEP), "--step-sleep", "0.05",
    )  # fmt: skip
    with FlagWatcher(serve, run) as watcher:
        code = run_launcher(cmd, env, tmp_path / "msrun.log", MSRUN_TIMEOUT_S)
        assert code == 0, f"msrun failed; see {tmp_path / 'msrun'}"
        serve.wait_for(
            "every rank to be finished",
            lambda: (
                len(states := serve.rank_states(run)) == RANKS
                and all(row["state"] == "finished" for row in states.values())
            ),
        )

    # Only the bad rank is flagged, and soon after the fault.
    assert watcher.flagged_ranks() == {FAULT_RANK}, watcher.first
    reported = [d["step"] for (rank, _, _), d in watcher.first.items() if rank == FAULT_RANK]
    assert min(reported) <= FAULT_STEP + WITHIN_STEPS, watcher.first
    assert all(d["since_step"] >= FAULT_STEP for d in watcher.first.values()), watcher.first
    alerts = serve.get(f"/api/alerts?run={run}") or {}
    alerted = {a.get("rank") for a in [*alerts.get("firing", []), *alerts.get("history", [])]}
    assert alerted - {None} <= {FAULT_RANK}, alerts

    # Every rank wrote its whole run and ended cleanly.
    jsonl = read_jsonl(log_dir / run)
    assert sorted(jsonl) == list(range(RANKS))
    for rank, recs in jsonl.items():
        steps = [r.step for r in recs if isinstance(r, records.StepRecord)]
        assert steps == list(range(1, STEPS + 1)), f"rank {rank} logged steps {steps[:5]}..."
        logged = [r for r in recs if isinstance(r, records.StepRecord)]
        assert all({"loss", "grad_norm_local"} <= set(r.metrics) for r in logged)
    ends = events_by_rank(jsonl, "end")
    assert all(len(ends[rank]) == 1 for rank in range(RANKS)), ends

    # What the store holds is exactly what the ranks wrote.
    serve.stop()
    assert_store_matches_jsonl(serve.data, run, jsonl)
