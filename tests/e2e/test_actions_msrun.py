"""The real 4-rank msrun job, rank 2 NaN from the fault step, `serve --policy stop-on-nan`:
every rank checkpoints and stops after one and the same step, within 3 steps of the fault; the
checkpoints load; msrun ends by itself (no rank hangs in a collective); the commands and every
rank's answers are stored and served.

The same job carries test_incidents_msrun's NaN checks: one incident, rank 2 its only culprit as
the first rank with a non-finite loss, the others (NaN one step later, through the all-reduce)
affected, said once on the console."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import launch_env, read_jsonl, require_msrun
from .test_incidents_msrun import (
    FAULT_RANK,
    OTHERS,
    assert_one_incident,
    culprit_steps,
    every_rank_finished,
    open_delay,
    watch_job,
)
from .test_msrun_e2e import RANKS, msrun_command

pytestmark = [pytest.mark.msrun, pytest.mark.mindspore, pytest.mark.timeout(300)]

FAULT_STEP = 12  # test_incidents_msrun's FAULT_STEP, which its checks assume
STEPS = 60
MAX_AFTER_FAULT = 3


def test_nan_policy_checkpoints_and_stops_every_rank_at_one_step(
    serve_factory: Any, tmp_path: Path
) -> None:
    msrun = require_msrun()
    serve = serve_factory(extra=["--policy", "stop-on-nan"], wait=False)  # watch_job waits
    run = f"e2e-actions-nan-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_RUN=run, RANKWATCH_ADDR=serve.ingest_addr, RANKWATCH_LOG_DIR=str(log_dir),
        RANKWATCH_ACCEPT="checkpoint,stop", MS_NODE_TIMEOUT="30",
    )  # fmt: skip
    cmd = msrun_command(
        msrun, tmp_path, "--steps", str(STEPS), "--fault", "nan", "--fault-rank", "2",
        "--fault-step", str(FAULT_STEP), "--step-sleep", "0.2",
    )  # fmt: skip
    started = time.time()
    job = watch_job(serve, run, cmd, env, tmp_path, every_rank_finished)
    took = job.log.stat().st_mtime - started  # the launcher's last line: msrun's end
    assert job.code == 0, (tmp_path / "launcher.log").read_text(errors="replace")[-3000:]

    by_rank = read_jsonl(log_dir / run)
    last = {r: max(s.step for s in recs if isinstance(s, records.StepRecord))
            for r, recs in by_rank.items()}  # fmt: skip
    assert sorted(last) == list(range(RANKS))
    (stopped,) = set(last.values())  # one step for every rank
    assert FAULT_STEP < stopped <= FAULT_STEP + MAX_AFTER_FAULT, last

    import mindspore as ms

    for rank in range(RANKS):
        path = log_dir / run / "checkpoints" / f"rank{rank}-step{stopped}.ckpt"
        params = ms.load_checkpoint(str(path))
        assert any("weight" in name for name in params), sorted(params)

    def answered() -> list[dict[str, Any]] | None:
        got = (serve.get(f"/api/run/commands?run={run}") or {}).get("commands") or []
        done = [c for c in got if c["state"] == "done"]
        return got if len(done) == 2 else None

    commands = serve.wait_for("every rank's answers", answered, 20.0)
    assert sorted(c["cmd"] for c in commands) == ["checkpoint", "stop"]
    for c in commands:
        assert c["step"] == stopped and c["by"] == "policy:nonfinite", c
        assert c["ranks"] == list(range(RANKS)) and "culprit rank 2" in c["reason"], c
        assert {a["step"] for a in c["acks"].values()} == {stopped}, c
    (incident,) = (serve.get(f"/api/run/incidents?run={run}") or {})["incidents"]
    assert incident["culprits"] == [2] and incident["cause"] == "nonfinite"
    shown = {a["cmd"]: a["counts"] for a in incident["actions"]}  # the action and its answers
    assert shown == {"checkpoint": {"done": RANKS}, "stop": {"done": RANKS}}, incident["actions"]

    # The incident names the first non-finite rank alone; the others are affected.
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP)
    inc = assert_one_incident(job, "nonfinite", fault_time)
    assert set(inc["affected"]) == set(OTHERS), job.describe()
    assert FAULT_STEP in culprit_steps(inc), job.describe()
    open_delay(job, inc, fault_time)

    saved = STEPS - stopped
    print(f"every rank stopped after step {stopped} (fault at {FAULT_STEP}): {saved} of "
          f"{STEPS} steps not trained; msrun ended in {took:.0f} s")  # fmt: skip
