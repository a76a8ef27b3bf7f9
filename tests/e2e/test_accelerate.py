"""examples/accelerate_loop.py under a real ``accelerate launch`` (2 CPU processes, gloo): the
plain Monitor takes each rank's identity from what Accelerate's launcher put in its environment.
JSONL only (no serve): the e2e tests of torchrun and the Trainer cover the path to the store."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import BIN, events_by_rank, free_port, launch_env, read_jsonl, run_launcher

pytestmark = [pytest.mark.torch, pytest.mark.hf, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_loop.py"
RANKS = 2
STEPS = 5


def test_accelerate_launch_gives_each_rank_its_identity(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    launcher = shutil.which("accelerate", path=str(BIN))
    if launcher is None:
        pytest.skip("accelerate is not in this environment's bin")
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_LOG_DIR=str(log_dir),
        RANKWATCH_ADDR="ipc://" + str(tmp_path / "nobody"),  # no aggregator: JSONL only
        HF_HOME=str(tmp_path / "hf"),  # no accelerate config of this machine's user
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    cmd = [
        launcher, "launch", "--multi_gpu", f"--num_processes={RANKS}", "--num_machines=1",
        "--mixed_precision=no", "--dynamo_backend=no", f"--main_process_port={free_port()}",
        str(EXAMPLE), "--steps", str(STEPS),
    ]  # fmt: skip
    code = run_launcher(cmd, env, tmp_path / "launch.log", 240.0)
    assert code == 0, (tmp_path / "launch.log").read_text(errors="replace")[-3000:]

    runs = list(log_dir.iterdir())
    assert len(runs) == 1, f"the ranks did not derive one run name: {runs}"
    jsonl: dict[int, list[Any]] = read_jsonl(runs[0])
    assert sorted(jsonl) == list(range(RANKS))
    norms = []
    for rank, recs in jsonl.items():
        start = events_by_rank(jsonl, "start")[rank][0]
        assert (start.rank, start.world_size) == (rank, RANKS)
        assert start.info["env"]["RANK"] == str(rank)
        steps = [r for r in recs if isinstance(r, records.StepRecord)]
        assert [r.step for r in steps] == list(range(1, STEPS + 1))
        assert all({"loss", "lr", "grad_norm_local"} <= set(r.metrics) for r in steps)
        norms.append(steps[0].metrics["grad_norm_local"])
        assert len(events_by_rank(jsonl, "end")[rank]) == 1
    assert norms[0] != norms[1]  # each rank's own gradients, before the all-reduce
