"""examples/torch_ddp.py under a real torchrun (2 ranks, gloo on CPU) with a real serve.

The ranks find the aggregator from torchrun's ``MASTER_ADDR`` at the default ingest port 8671
when that port is free here (no ``RANKWATCH_ADDR``); otherwise through ``RANKWATCH_ADDR``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent import DEFAULT_INGEST_PORT
from rankwatch.agent.wire import records

from .conftest import (
    Serve,
    assert_store_matches_jsonl,
    events_by_rank,
    free_port,
    launch_env,
    port_free,
    read_jsonl,
    require_torchrun,
    run_launcher,
)

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_ddp.py"
RANKS = 2
STEPS = 30


def test_torch_ddp_example(serve_factory: Any, tmp_path: Path) -> None:
    torchrun = require_torchrun()
    derived = port_free(DEFAULT_INGEST_PORT) and port_free(DEFAULT_INGEST_PORT, "0.0.0.0")
    serve: Serve = serve_factory(  # ready while torchrun starts (run_launcher waits)
        ingest_port=DEFAULT_INGEST_PORT if derived else None, wait=False
    )
    run = f"e2e-torchrun-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(RANKWATCH_RUN=run, RANKWATCH_LOG_DIR=str(log_dir), OMP_NUM_THREADS="1")
    if not derived:
        env["RANKWATCH_ADDR"] = serve.ingest_addr
    cmd = [
        torchrun, f"--nproc-per-node={RANKS}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", str(EXAMPLE), "--steps", str(STEPS),
    ]  # fmt: skip
    code = run_launcher(cmd, env, tmp_path / "torchrun.log", 240.0, meanwhile=serve.wait_ready)
    log = (tmp_path / "torchrun.log").read_text(errors="replace")[-3000:]
    assert code == 0, log

    serve.wait_for(
        "both ranks to be finished",
        lambda: (
            len(states := serve.rank_states(run)) == RANKS
            and all(row["state"] == "finished" for row in states.values())
        ),
    )
    jsonl = read_jsonl(log_dir / run)
    assert sorted(jsonl) == list(range(RANKS))
    for rank, recs in jsonl.items():
        start = events_by_rank(jsonl, "start")[rank][0]
        assert start.info.get("launcher") == "torchrun"
        if derived:
            assert start.info.get("addr") == f"tcp://127.0.0.1:{DEFAULT_INGEST_PORT}"
        steps = [r for r in recs if isinstance(r, records.StepRecord)]
        assert [r.step for r in steps] == list(range(1, STEPS + 1))
        # The comm hook stages each rank's own norm during backward, before log().
        assert all({"loss", "lr", "grad_norm_local"} <= set(r.metrics) for r in steps)
        assert len(events_by_rank(jsonl, "end")[rank]) == 1

    serve.stop()
    assert_store_matches_jsonl(serve.data, run, jsonl)
