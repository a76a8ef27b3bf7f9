"""A real 4-rank msrun data-parallel job with TrainMonitor: JSONL per rank and the same records
over ZeroMQ to a ROUTER bound here (standing in for the aggregator)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

pytestmark = [
    pytest.mark.msrun,
    pytest.mark.mindspore,
    pytest.mark.skipif(
        importlib.util.find_spec("mindspore") is None, reason="MindSpore is not installed"
    ),
]

SCRIPT = Path(__file__).parent / "ms_scripts" / "dp_train.py"
WORLD = 4
STEPS_PER_EPOCH = 5
EPOCHS = 2
JOB_TIMEOUT_S = 120.0  # the job takes about 20 s on 2 cores; allow for a loaded machine
DRAIN_S = 5.0  # after msrun exits, wait this long at most for the last frames
NODE_TIMEOUT_S = "20"  # msrun's scheduler gives up on a silent rank after this


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _msrun() -> str | None:
    local = Path(sys.executable).parent / "msrun"
    return str(local) if local.exists() else shutil.which("msrun")


def _wire(recs: list[records.Record]) -> list[dict[str, Any]]:
    """Step and event records as wire maps in seq order (heartbeats are timing-dependent)."""
    kept = [records.to_wire(r) for r in recs if r.kind != "heartbeat"]
    return sorted(kept, key=lambda w: w["seq"])


def _receive_while(proc: subprocess.Popen[bytes], router: Any) -> None:
    """Collect frames until msrun has exited and every rank's end event is in (or time is up)."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    drain_until: float | None = None
    while time.monotonic() < (drain_until or deadline):
        router.poll(0.1)
        if proc.poll() is None:
            continue
        ended = {r.rank for r in router.received if r.kind == "event" and r.event == "end"}
        if len(ended) == WORLD:
            return
        if drain_until is None:
            drain_until = time.monotonic() + DRAIN_S


def test_msrun_four_ranks_jsonl_and_zmq(tmp_path: Path, router: Any) -> None:
    """``router``: conftest's ROUTER on 127.0.0.1, standing in for the aggregator."""
    msrun = _msrun()
    if msrun is None:
        pytest.skip("msrun is not on PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH_")}
    env.update(
        # msrun finds python through PATH: the workers need this interpreter's packages
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        MS_NODE_TIMEOUT=NODE_TIMEOUT_S,
        RANKWATCH_ADDR=router.addr,
        RANKWATCH_LOG_DIR=str(tmp_path / "rw"),
        RANKWATCH_TELEMETRY="off",  # the records are counted exactly
    )
    command = [
        msrun,
        f"--worker_num={WORLD}",
        f"--local_worker_num={WORLD}",
        f"--master_port={_free_port()}",
        f"--log_dir={tmp_path / 'msrun_logs'}",
        "--join=True",
        str(SCRIPT),
        str(STEPS_PER_EPOCH),
        str(EPOCHS),
    ]
    started = time.monotonic()
    with open(tmp_path / "msrun.out", "wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _receive_while(proc, router)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # our own msrun's process group only
            proc.wait()
    elapsed = time.monotonic() - started
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("msrun_logs/*"))
    assert proc.returncode == 0, f"msrun failed ({proc.returncode}):\n{logs}"
    assert elapsed < JOB_TIMEOUT_S

    # One run directory, named by the agent (RANKWATCH_RUN unset): one file per rank.
    run_dirs = list((tmp_path / "rw").iterdir())
    assert len(run_dirs) == 1, run_dirs
    # script, msrun's start (UTC), suffix (agent/identity.py)
    assert re.fullmatch(r".+-\d{4}-\d{4}-[0-9a-f]{4}", run_dirs[0].name), run_dirs[0].name
    files = sorted(p.name for p in run_dirs[0].iterdir())
    assert files == [f"rank{k}.jsonl" for k in range(WORLD)]

    total = STEPS_PER_EPOCH * EPOCHS
    runs: set[str] = set()
    first_step: dict[int, dict[str, float]] = {}
    for rank in range(WORLD):
        lines = (run_dirs[0] / f"rank{rank}.jsonl").read_text().splitlines()
        jsonl = [records.from_json_line(line) for line in lines if line.strip()]
        assert {r.rank for r in jsonl} == {rank}
        runs |= {r.run for r in jsonl}
        steps = [r for r in jsonl if r.kind == "step"]
        assert [r.step for r in steps] == list(range(1, total + 1))
        assert [r.epoch for r in steps] == [1 + i // STEPS_PER_EPOCH for i in range(total)]
        assert all(r.world_size == WORLD for r in steps)
        for r in steps:
            assert {"loss", "grad_norm_local", "lr"} <= set(r.metrics), r.metrics
        first_step[rank] = dict(steps[0].metrics)
        events = [(r.event, r.info.get("reason")) for r in jsonl if r.kind == "event"]
        assert events == [("start", None), ("end", "normal")]
        # The aggregator side got exactly the same step and event records.
        mine = [r for r in router.received if r.rank == rank]
        assert _wire(mine) == _wire(jsonl)
    assert len(runs) == 1 and runs == {run_dirs[0].name}
    # Each rank trains on its own shard: losses and pre-all-reduce grad norms differ per rank.
    assert len({m["loss"] for m in first_step.values()}) == WORLD
    assert len({m["grad_norm_local"] for m in first_step.values()}) == WORLD
