"""examples/hf_trainer.py (a 2-layer GPT-2 from a config, the Hugging Face ``Trainer``) under a
real torchrun (2 ranks, gloo on CPU) with a real serve. The store's per-rank losses are the ones
each rank computed for itself (tests/e2e/hf_job.py), their mean is the Trainer's logged loss, and
lr and grad_norm are the Trainer's own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import (
    Serve,
    assert_store_matches_jsonl,
    free_port,
    launch_env,
    read_jsonl,
    require_torchrun,
    run_launcher,
    stored_records,
)

pytestmark = [pytest.mark.torch, pytest.mark.hf, pytest.mark.timeout(300)]

JOB = Path(__file__).resolve().parent / "hf_job.py"
RANKS = 2
STEPS = 6
ACCUMULATION = 2
EVAL_EVERY = 3


def test_hf_trainer_each_rank_records_its_own(serve_factory: Any, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    torchrun = require_torchrun()
    serve: Serve = serve_factory(wait=False)  # ready while torchrun starts (run_launcher waits)
    run = f"e2e-hf-{os.getpid()}"
    log_dir, expect_dir = tmp_path / "jsonl", tmp_path / "expect"
    expect_dir.mkdir()
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(log_dir),
        EXPECT_DIR=str(expect_dir),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        HF_HUB_OFFLINE="1",
    )
    cmd = [
        torchrun, f"--nproc-per-node={RANKS}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", str(JOB), "--steps", str(STEPS),
        "--accumulation", str(ACCUMULATION), "--eval-every", str(EVAL_EVERY),
        "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    code = run_launcher(cmd, env, tmp_path / "torchrun.log", 240.0, meanwhile=serve.wait_ready)
    assert code == 0, (tmp_path / "torchrun.log").read_text(errors="replace")[-3000:]
    serve.wait_for(
        "both ranks to be finished",
        lambda: (
            len(states := serve.rank_states(run)) == RANKS
            and all(row["state"] == "finished" for row in states.values())
        ),
    )
    serve.stop()
    jsonl = read_jsonl(log_dir / run)
    assert_store_matches_jsonl(serve.data, run, jsonl)

    stored = stored_records(serve.data, run)
    steps = {
        rank: {
            r.step: r.metrics
            for r in recs
            if isinstance(r, records.StepRecord) and "loss" in r.metrics
        }
        for rank, recs in stored.items()
    }
    assert sorted(steps) == list(range(RANKS))
    for rank, by_step in steps.items():
        expected = json.loads((expect_dir / f"expected_rank{rank}.json").read_text())
        assert sorted(by_step) == [int(s) for s in expected] == list(range(1, STEPS + 1))
        for step, loss in expected.items():
            assert by_step[int(step)]["loss"] == pytest.approx(loss, rel=1e-5), (rank, step)
        evals = [
            r.step
            for r in stored[rank]
            if isinstance(r, records.StepRecord) and "eval_loss" in r.metrics
        ]
        assert evals == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))

    history = json.loads((expect_dir / "log_history.json").read_text())
    logged = {h["step"]: h for h in history if "loss" in h and "grad_norm" in h}
    assert sorted(logged) == list(range(1, STEPS + 1))
    for step, entry in logged.items():
        ours = [steps[rank][step] for rank in range(RANKS)]
        # The Trainer's loss is the mean of the ranks' own; lr and grad_norm are its own.
        assert sum(m["loss"] for m in ours) / RANKS == pytest.approx(entry["loss"], rel=1e-5)
        for m in ours:
            assert m["lr"] == pytest.approx(entry["learning_rate"], rel=1e-9)
            assert m["grad_norm"] == pytest.approx(entry["grad_norm"], rel=1e-5)
            assert "grad_norm_local" in m
    assert steps[0][1]["grad_norm_local"] != steps[1][1]["grad_norm_local"]
