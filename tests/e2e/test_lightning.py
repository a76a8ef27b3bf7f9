"""examples/lightning_ddp.py under Lightning's own DDP launcher (2 CPU processes, gloo) with a
real serve: rank 1 gets wrong labels from step 12 on and is the one flagged; the losses the
store holds for each rank are the ones that rank computed for itself (tests/e2e/lightning_job.py).

No ``RANKWATCH_RUN``: Lightning's rank 1 is a child of rank 0, so the two derive different
launch names, and the callback's broadcast of rank 0's name is what keeps them in one run.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import (
    FlagWatcher,
    Serve,
    assert_store_matches_jsonl,
    free_port,
    launch_env,
    read_jsonl,
    run_launcher,
    stored_records,
)

pytestmark = [pytest.mark.torch, pytest.mark.lightning, pytest.mark.timeout(300)]

JOB = Path(__file__).resolve().parent / "lightning_job.py"
RANKS = 2
STEPS = 30
CORRUPT_RANK = 1
CORRUPT_FROM = 12
VAL_EVERY = 10


def first_run(serve: Serve) -> str | None:
    runs = (serve.get("/api/status") or {}).get("runs") or []
    return runs[0]["run"] if runs else None


def test_lightning_ddp_each_rank_records_its_own(serve_factory: Any, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    serve: Serve = serve_factory()
    log_dir, expect_dir = tmp_path / "jsonl", tmp_path / "expect"
    expect_dir.mkdir()
    env = launch_env(
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(log_dir),
        EXPECT_DIR=str(expect_dir),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    cmd = [
        sys.executable, str(JOB), "--steps", str(STEPS), "--devices", str(RANKS),
        "--corrupt-rank", str(CORRUPT_RANK), "--corrupt-from", str(CORRUPT_FROM),
        "--val-every", str(VAL_EVERY),
    ]  # fmt: skip
    done: dict[str, int] = {}
    job = threading.Thread(
        target=lambda: done.update(code=run_launcher(cmd, env, tmp_path / "job.log", 240.0))
    )
    job.start()
    run = serve.wait_for("the run to appear", lambda: first_run(serve), 120.0)
    with FlagWatcher(serve, run) as flags:
        job.join(260.0)
        serve.wait_for(
            "both ranks to be finished",
            lambda: (
                len(states := serve.rank_states(run)) == RANKS
                and all(row["state"] == "finished" for row in states.values())
            ),
        )
    log = (tmp_path / "job.log").read_text(errors="replace")[-3000:]
    assert done.get("code") == 0, log
    assert [p.name for p in log_dir.iterdir()] == [run], "the ranks did not share one run"
    assert flags.flagged_ranks() == {CORRUPT_RANK}, flags.first

    jsonl = read_jsonl(log_dir / run)
    assert sorted(jsonl) == list(range(RANKS))
    for recs in jsonl.values():
        steps = [r for r in recs if isinstance(r, records.StepRecord)]
        train = [r for r in steps if "loss" in r.metrics]
        assert [r.step for r in train] == list(range(1, STEPS + 1))
        assert all({"loss", "lr", "train_acc", "grad_norm_local"} <= set(r.metrics) for r in train)
        assert all("throughput" in r.metrics for r in train[1:])
        val = [r.step for r in steps if "val_loss" in r.metrics]
        assert val == list(range(VAL_EVERY, STEPS + 1, VAL_EVERY))

    serve.stop()
    assert_store_matches_jsonl(serve.data, run, jsonl)
    stored = stored_records(serve.data, run)
    for rank in range(RANKS):
        expected = json.loads((expect_dir / f"expected_rank{rank}.json").read_text())
        have = {
            r.step: r.metrics["loss"]
            for r in stored[rank]
            if isinstance(r, records.StepRecord) and "loss" in r.metrics
        }
        assert sorted(have) == sorted(int(s) for s in expected)
        for step, loss in expected.items():
            assert have[int(step)] == pytest.approx(loss, rel=1e-5), (rank, step)
