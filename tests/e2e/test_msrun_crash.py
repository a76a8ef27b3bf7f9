"""A real msrun job in which rank 2 raises: it must show crashed (with its message), and the
ranks msrun then SIGKILLs must show lost."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import (
    Serve,
    assert_store_matches_jsonl,
    events_by_rank,
    launch_env,
    lost_after_config,
    read_jsonl,
    require_msrun,
    run_launcher,
)
from .test_msrun_e2e import RANKS, msrun_command

pytestmark = [pytest.mark.msrun, pytest.mark.mindspore, pytest.mark.timeout(420)]

CRASH_RANK = 2
CRASH_STEP = 15
STEPS = 200  # far more than are reached: the job must die of the crash, not finish
LOST_AFTER_S = 5.0  # serve's silence limit before a rank counts as lost


def test_crashed_rank_and_killed_ranks(serve_factory: Any, tmp_path: Path) -> None:
    msrun = require_msrun()
    serve: Serve = serve_factory(extra=lost_after_config(tmp_path / "serve.toml", LOST_AFTER_S))
    run = f"e2e-msrun-crash-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(log_dir),
        MS_NODE_TIMEOUT="5",
    )
    cmd = msrun_command(
        msrun, tmp_path, "--steps", str(STEPS), "--fault", "crash",
        "--fault-rank", str(CRASH_RANK), "--fault-step", str(CRASH_STEP), "--step-sleep", "0.05",
    )  # fmt: skip
    code = run_launcher(cmd, env, tmp_path / "msrun.log", 300.0)
    assert code != 0, "msrun should fail when a rank raises"

    def settled() -> dict[int, dict[str, Any]] | None:
        states = serve.rank_states(run)
        if len(states) != RANKS or states[CRASH_RANK]["state"] != "crashed":
            return None
        others = [states[r]["state"] for r in range(RANKS) if r != CRASH_RANK]
        return states if all(s == "lost" for s in others) else None

    states = serve.wait_for("crashed + lost ranks", settled, timeout_s=LOST_AFTER_S + 30)
    assert "injected fault" in (states[CRASH_RANK].get("message") or ""), states[CRASH_RANK]
    entry = serve.run_entry(run) or {}
    assert entry.get("state") in ("crashed", "lost"), entry.get("state")

    jsonl = read_jsonl(log_dir / run)
    assert sorted(jsonl) == list(range(RANKS))
    crashes = events_by_rank(jsonl, "crash")
    assert [len(crashes[r]) for r in range(RANKS)] == [0, 0, 1, 0]
    info = crashes[CRASH_RANK][0].info
    assert "RuntimeError" in info["exc_type"] and "injected fault" in info["message"]
    last_steps = {
        rank: max((r.step for r in recs if isinstance(r, records.StepRecord)), default=0)
        for rank, recs in jsonl.items()
    }
    assert last_steps[CRASH_RANK] == CRASH_STEP - 1
    ends = events_by_rank(jsonl, "end")
    assert not any(ends.values()), f"SIGKILLed ranks cannot say goodbye: {ends}"

    serve.stop()
    assert_store_matches_jsonl(serve.data, run, jsonl)
