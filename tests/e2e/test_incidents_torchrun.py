"""Real torchrun jobs (3 gloo ranks on CPU), one fault on rank 2 per test: the incident must
name rank 2 alone. The job is examples/torch_ddp.py with the fault injected by
tests/e2e/torch_fault_job.py; serve and the incident polling are those of the msrun tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import Serve, free_port, launch_env, lost_after_config, require_torchrun
from .test_incidents_msrun import (
    FAULT_RANK,
    FAULT_STEP,
    HEARTBEAT_S,
    LOST_AFTER_S,
    Job,
    assert_one_incident,
    culprit_steps,
    open_delay,
    watch_job,
)

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

JOB = Path(__file__).resolve().parent / "torch_fault_job.py"
RANKS = 3
OTHERS = tuple(r for r in range(RANKS) if r != FAULT_RANK)
GLOO_TIMEOUT_S = 6  # a hung rank's peers fail in their collective this long after it


def run_fault(serve_factory: Any, tmp_path: Path, fault: str, steps: int, settled: Any) -> Job:
    torchrun = require_torchrun()
    serve: Serve = serve_factory(
        extra=lost_after_config(tmp_path / "serve.toml", LOST_AFTER_S), wait=False
    )  # ready before the ranks' first records: watch_job waits for it while torchrun starts
    run = f"e2e-torch-incident-{fault}-{os.getpid()}"
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(tmp_path / "jsonl"),
        OMP_NUM_THREADS="1",
        FAULT=fault,
        FAULT_RANK=str(FAULT_RANK),
        FAULT_STEP=str(FAULT_STEP),
        GLOO_TIMEOUT_S=str(GLOO_TIMEOUT_S),
        RANKWATCH_HEARTBEAT_S=str(HEARTBEAT_S),
    )
    cmd = [
        torchrun, f"--nproc-per-node={RANKS}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", str(JOB), "--steps", str(steps), "--step-sleep", "0.05",
    ]  # fmt: skip
    return watch_job(serve, run, cmd, env, tmp_path, settled, ranks=RANKS)


def every_rank_down(incidents: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> bool:
    if not incidents or any(row["state"] == "alive" for row in states.values()):
        return False
    inc = incidents[-1]
    return set(inc["affected"] + inc["terminated"]) >= set(OTHERS) and bool(culprit_steps(inc))


def test_torch_nan_names_the_first_nonfinite_rank(serve_factory: Any, tmp_path: Path) -> None:
    def settled(incidents: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> bool:
        return bool(incidents) and all(row["state"] == "finished" for row in states.values())

    job = run_fault(serve_factory, tmp_path, "nan", 25, settled)
    assert job.code == 0, job.describe()
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP)
    inc = assert_one_incident(job, "nonfinite", fault_time)
    assert set(inc["affected"]) == set(OTHERS), job.describe()
    assert FAULT_STEP in culprit_steps(inc), job.describe()
    open_delay(job, inc, fault_time)


def test_torch_crash_names_the_raising_rank(serve_factory: Any, tmp_path: Path) -> None:
    job = run_fault(serve_factory, tmp_path, "crash", 200, every_rank_down)
    assert job.code != 0, job.describe()
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP - 1)
    inc = assert_one_incident(job, "crash", fault_time)
    assert set(inc["affected"] + inc["terminated"]) == set(OTHERS), job.describe()
    assert FAULT_STEP - 1 in culprit_steps(inc), job.describe()
    open_delay(job, inc, fault_time)


def test_torch_hang_names_the_sleeping_rank(serve_factory: Any, tmp_path: Path) -> None:
    job = run_fault(serve_factory, tmp_path, "hang", 200, every_rank_down)
    assert job.code != 0, job.describe()
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP - 1)
    inc = assert_one_incident(job, "hang", fault_time)
    assert set(inc["affected"] + inc["terminated"]) == set(OTHERS), job.describe()
    assert FAULT_STEP - 1 in culprit_steps(inc), job.describe()
    hung = [line for line in job.console if line.startswith("[INCIDENT]")]
    assert f"hung after step {FAULT_STEP - 1} " in hung[0], job.describe()  # as first said
    open_delay(job, inc, fault_time)
