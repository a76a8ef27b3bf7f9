"""Silent data corruption in a real 4-rank msrun job, with a real `rankwatch serve` watching it.

From step 12 rank 2 scales its local gradients by 1 + EPS before the all-reduce (the demo's
``--fault sdc``): every rank applies the same averaged gradients, so the loss shows nothing, and
only rank 2's own pre-all-reduce ``grad_norm_local`` can. The aggregator must flag rank 2 on
``grad_norm_local`` within 20 steps and nothing else: no other rank, no loss.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import (
    FlagWatcher,
    Serve,
    launch_env,
    read_jsonl,
    require_msrun,
    run_launcher,
)
from .test_msrun_e2e import RANKS, msrun_command

pytestmark = [pytest.mark.msrun, pytest.mark.mindspore, pytest.mark.timeout(300)]

FAULT_RANK = 2
FAULT_STEP = 12
WITHIN_STEPS = 20
STEPS = FAULT_STEP + WITHIN_STEPS
EPS = 0.5  # flagged in every run of bench/sdc_msrun.py (docs/benchmarks.md)
LOSS_RATIO = 1.3  # rank 2's loss stays within this of the others' median, as on a clean run
MSRUN_TIMEOUT_S = 240.0


def test_sdc_rank_flagged_on_local_grad_norm_only(serve_factory: Any, tmp_path: Path) -> None:
    msrun = require_msrun()
    serve: Serve = serve_factory(wait=False)  # ready while msrun starts (run_launcher waits)
    run = f"e2e-msrun-sdc-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(log_dir),
        MS_NODE_TIMEOUT="30",
    )
    cmd = msrun_command(
        msrun, tmp_path, "--steps", str(STEPS), "--fault", "sdc", "--sdc-eps", str(EPS),
        "--fault-rank", str(FAULT_RANK), "--fault-step", str(FAULT_STEP), "--step-sleep", "0.05",
    )  # fmt: skip
    with FlagWatcher(serve, run) as watcher:
        code = run_launcher(
            cmd, env, tmp_path / "msrun.log", MSRUN_TIMEOUT_S, meanwhile=serve.wait_ready
        )
        assert code == 0, f"msrun failed; see {tmp_path / 'msrun'}"
        serve.wait_for(
            "every rank to be finished",
            lambda: (
                len(states := serve.rank_states(run)) == RANKS
                and all(row["state"] == "finished" for row in states.values())
            ),
        )

    # rank 2 on its local gradient norm, from the fault on, and nothing else.
    assert set(watcher.first) == {(FAULT_RANK, "outlier", "grad_norm_local")}, watcher.first
    flag = watcher.first[(FAULT_RANK, "outlier", "grad_norm_local")]
    assert flag["since_step"] >= FAULT_STEP and flag["step"] < STEPS, flag
    assert flag["direction"] == "high" and flag["rel"] > 1.0, flag
    alerts = serve.get(f"/api/alerts?run={run}") or {}
    alerted = {
        (a.get("rank"), a.get("metric"))
        for a in [*alerts.get("firing", []), *alerts.get("history", [])]
        if a.get("rank") is not None
    }
    assert alerted <= {(FAULT_RANK, "grad_norm_local")}, alerts

    # The fault is really in the gradients and not in the loss: rank 2's local norm is about
    # 1 + EPS times the others' from the fault step, its loss is like theirs.
    jsonl = read_jsonl(log_dir / run)
    steps = {
        rank: {r.step: r.metrics for r in recs if isinstance(r, records.StepRecord)}
        for rank, recs in jsonl.items()
    }
    assert sorted(steps) == list(range(RANKS))
    norm_ratio, loss_ratio = [], []
    for step in range(FAULT_STEP, STEPS + 1):
        others = [steps[r][step] for r in range(RANKS) if r != FAULT_RANK]
        bad = steps[FAULT_RANK][step]
        norm_ratio.append(
            bad["grad_norm_local"] / statistics.median(m["grad_norm_local"] for m in others)
        )
        loss_ratio.append(bad["loss"] / statistics.median(m["loss"] for m in others))
    assert 1 + EPS / 2 < statistics.median(norm_ratio) < 1 + 2 * EPS, norm_ratio
    assert all(1 / LOSS_RATIO < r < LOSS_RATIO for r in loss_ratio), loss_ratio
