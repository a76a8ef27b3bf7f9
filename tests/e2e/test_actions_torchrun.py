"""The same proof with torchrun (3 gloo ranks on CPU, examples/torch_ddp.py): rank 2 NaN from
the fault step, `serve --policy stop-on-nan`: every rank saves its weights and breaks out of
the loop after one step, within 3 steps of the fault, and the job ends by itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import free_port, launch_env, read_jsonl, require_torchrun, run_launcher
from .test_actions_msrun import FAULT_STEP, MAX_AFTER_FAULT

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

JOB = Path(__file__).with_name("torch_fault_job.py")
RANKS = 3
STEPS = 60


def test_nan_policy_stops_every_torch_rank_at_one_step(serve_factory: Any, tmp_path: Path) -> None:
    torchrun = require_torchrun()
    serve = serve_factory(extra=["--policy", "stop-on-nan"], wait=False)  # run_launcher waits
    run = f"e2e-actions-torch-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_RUN=run, RANKWATCH_ADDR=serve.ingest_addr, RANKWATCH_LOG_DIR=str(log_dir),
        RANKWATCH_ACCEPT="checkpoint,stop", OMP_NUM_THREADS="1", FAULT="nan", FAULT_RANK="2",
        FAULT_STEP=str(FAULT_STEP), GLOO_TIMEOUT_S="30",
    )  # fmt: skip
    cmd = [
        torchrun, f"--nproc-per-node={RANKS}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", str(JOB), "--steps", str(STEPS), "--step-sleep", "0.2",
    ]  # fmt: skip
    code = run_launcher(cmd, env, tmp_path / "launcher.log", 180.0, meanwhile=serve.wait_ready)
    assert code == 0, (tmp_path / "launcher.log").read_text(errors="replace")[-3000:]
    by_rank = read_jsonl(log_dir / run)
    last = {r: max(s.step for s in recs if isinstance(s, records.StepRecord))
            for r, recs in by_rank.items()}  # fmt: skip
    (stopped,) = set(last.values())
    assert sorted(last) == list(range(RANKS)), last
    assert FAULT_STEP < stopped <= FAULT_STEP + MAX_AFTER_FAULT, last

    import torch

    for rank in range(RANKS):
        state = torch.load(log_dir / "checkpoints" / f"rank{rank}-step{stopped}.pt")
        assert any(name.endswith("weight") for name in state), sorted(state)

    def answered() -> list[dict[str, Any]] | None:
        got = (serve.get(f"/api/run/commands?run={run}") or {}).get("commands") or []
        return got if sum(c["state"] == "done" for c in got) == 2 else None

    commands = serve.wait_for("every rank's answers", answered, 20.0)
    assert {c["step"] for c in commands} == {stopped}
    print(f"torchrun: every rank stopped after step {stopped} (fault at {FAULT_STEP})")
