"""MindFormers 2.0.0's own callback registry, callbacks and train cell in a real 2-rank msrun job
(mindformers_job.py), with ``RankwatchMonitor`` named in the YAML (loaded by MindFormers from
examples/mindformers_rankwatch.py) and a real `rankwatch serve`.

The test replays the job in numpy (same start weights, data and SGD; the update skipped at an
overflow or a global-norm spike, as ``MFTrainOneStepCell`` skips it) and checks that the store
holds, for every rank and step, that rank's own loss, gradient norm before the all-reduce and the
local loss MindFormers accumulates (read by its ``TrainingStateMonitor``),
the global norm, lr, loss scale, overflow, the skipped-step and spike counters, the spike notes
and the weight norm that MindFormers' ``TrainingStateMonitor`` computed.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankwatch.agent.wire import records

from . import mindformers_job as job
from .conftest import (
    Serve,
    assert_store_matches_jsonl,
    free_port,
    launch_env,
    read_jsonl,
    require_msrun,
    run_launcher,
    stored_records,
)

pytestmark = [pytest.mark.msrun, pytest.mark.mindspore, pytest.mark.timeout(420)]

# Where deploy/dev-setup.sh --tests installs MindFormers and its dependencies, beside the venv's
# own packages (it needs a pyarrow, pandas and huggingface_hub the rest of the suite must not see).
MINDFORMERS_PATH = Path(sys.prefix) / "mindformers"
JOB = Path(job.__file__)
EXAMPLES = JOB.parents[2] / "examples"
RANKS = 2
MSRUN_TIMEOUT_S = 300.0  # about 80 s on a busy 2-core machine: MindFormers imports for 10-25 s
REL = 1e-4  # MindSpore computes in float32, the replay in float64


def replay() -> list[dict[int, dict[str, float]]]:
    """Per step (from 1), per rank: the metrics the job must have recorded."""
    plans = [job.plan(rank) for rank in range(RANKS)]
    weight = plans[0][0].astype(np.float64)
    bias = plans[0][1].astype(np.float64)
    skipped = spikes = 0
    out: list[dict[int, dict[str, float]]] = []
    with np.errstate(all="ignore"):
        for step in range(job.STEPS):
            grads: list[tuple[np.ndarray, np.ndarray]] = []
            rows: dict[int, dict[str, float]] = {}
            for rank, (_, _, x_all, y_all) in enumerate(plans):
                x = x_all[step].astype(np.float64)
                logits = x @ weight.T + bias
                shifted = logits - logits.max(axis=1, keepdims=True)
                log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
                onehot = np.eye(job.CLASSES)[y_all[step]]
                loss = float(-(log_p * onehot).sum() / job.BATCH)
                g_logits = (np.exp(log_p) - onehot) / job.BATCH
                g_weight, g_bias = g_logits.T @ x, g_logits.sum(axis=0)
                grads.append((g_weight, g_bias))
                local = math.sqrt(float((g_weight**2).sum() + (g_bias**2).sum()))
                # device_accum_local_lm_loss: this card's loss as MindFormers' CrossEntropyLoss
                # accumulates it (one micro-batch here), read by TrainingStateMonitor
                rows[rank] = {
                    "loss": loss, "grad_norm_local": local, "device_accum_local_lm_loss": loss
                }  # fmt: skip
            overflow = not all(np.isfinite(g).all() for pair in grads for g in pair)
            mean_weight = sum(g for g, _ in grads) / RANKS
            mean_bias = sum(g for _, g in grads) / RANKS
            norm = math.sqrt(float((mean_weight**2).sum() + (mean_bias**2).sum()))
            spike = norm >= job.SPIKE_THRESHOLD
            skipped += overflow or spike
            spikes += spike
            if not (overflow or spike):
                weight = weight - job.LR * mean_weight
                bias = bias - job.LR * mean_bias
            weight_norm = math.sqrt(float((weight**2).sum() + (bias**2).sum()))
            for row in rows.values():
                row.update(
                    grad_norm=norm, overflow=float(overflow), loss_scale=1.0, lr=job.LR,
                    skipped_steps=float(skipped), grad_norm_spikes=float(spikes),
                    weight_norm=weight_norm,
                )  # fmt: skip
            out.append(rows)
    return out


def _close(have: float, want: float) -> bool:
    if not math.isfinite(want):
        return not math.isfinite(have)
    return math.isclose(have, want, rel_tol=REL, abs_tol=1e-6)


def test_replay_covers_every_case() -> None:
    """The job's plan holds what the msrun test must see: a spike, an overflow, a bad rank."""
    steps = replay()
    spikes = [i + 1 for i, rows in enumerate(steps) if rows[0]["grad_norm"] >= job.SPIKE_THRESHOLD]
    assert spikes == [job.SPIKE_STEP]  # a NaN norm is none, in MindFormers' check too
    assert [i + 1 for i, rows in enumerate(steps) if rows[0]["overflow"]] == [job.OVERFLOW_STEP]
    unusual = (job.SPIKE_STEP, job.OVERFLOW_STEP)
    healthy = [rows for i, rows in enumerate(steps) if i + 1 not in unusual]
    assert all(r[job.BAD_RANK]["grad_norm_local"] > 1.5 * r[0]["grad_norm_local"] for r in healthy)
    assert steps[-1][0]["skipped_steps"] == 2
    assert steps[0][0]["weight_norm"] != steps[-1][0]["weight_norm"]  # the updates happened


@pytest.mark.skipif(
    not (MINDFORMERS_PATH / "mindformers").is_dir(),
    reason=f"MindFormers is not installed in {MINDFORMERS_PATH} (bash deploy/dev-setup.sh --tests)",
)
def test_mindformers_yaml_callback_two_ranks(serve_factory: Any, tmp_path: Path) -> None:
    msrun = require_msrun()
    serve: Serve = serve_factory(wait=False)  # ready while msrun starts (run_launcher waits)
    run = f"e2e-mindformers-{os.getpid()}"
    log_dir = tmp_path / "jsonl"
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(log_dir),
        RANKWATCH_MINDFORMERS_PATH=str(MINDFORMERS_PATH),
        REGISTER_PATH=str(EXAMPLES),  # where MindFormers' auto_register finds the example
        OM_MODULES_CACHE=str(tmp_path / "modules"),  # where it copies that module to import it
        MS_NODE_TIMEOUT="60",  # MindFormers' import on a busy machine must not time a rank out
    )
    cmd = [
        msrun, f"--worker_num={RANKS}", f"--local_worker_num={RANKS}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        f"--log_dir={tmp_path / 'msrun'}", "--join=True", str(JOB),
    ]  # fmt: skip
    # cwd: MindFormers writes its logs (and the job its YAML) under the working directory
    code = run_launcher(
        cmd, env, tmp_path / "msrun.log", MSRUN_TIMEOUT_S, cwd=tmp_path, meanwhile=serve.wait_ready
    )
    assert code == 0, f"msrun failed; see {tmp_path / 'msrun'}"
    serve.wait_for(
        "every rank to be finished",
        lambda: (
            len(states := serve.rank_states(run)) == RANKS
            and all(row["state"] == "finished" for row in states.values())
        ),
    )
    serve.stop()
    stored = stored_records(serve.data, run)
    assert sorted(stored) == list(range(RANKS))

    want = replay()
    for rank, recs in stored.items():
        by_step: dict[int, dict[str, float]] = {}
        for rec in recs:
            if isinstance(rec, records.StepRecord):
                by_step.setdefault(rec.step, {}).update(rec.metrics)
        assert sorted(by_step) == list(range(1, job.STEPS + 1)), f"rank {rank}: {sorted(by_step)}"
        for step, have in by_step.items():
            expected = want[step - 1][rank]
            wrong = {
                name: (have.get(name), value)
                for name, value in expected.items()
                if name not in have or not _close(have[name], value)
            }
            assert not wrong, f"rank {rank} step {step}: (stored, replayed) {wrong}"
        notes = [
            r for r in recs if isinstance(r, records.EventRecord) and r.event == "note"
        ]  # fmt: skip
        spikes = [n.step for n in notes if n.info.get("note") == "grad_norm_spike"]
        assert spikes == [job.SPIKE_STEP], notes

    # The bad rank is told apart by its own gradient norm, which a mean would hide.
    last = {rank: want[-1][rank]["grad_norm_local"] for rank in range(RANKS)}
    assert last[job.BAD_RANK] > 1.5 * last[0]
    assert_store_matches_jsonl(serve.data, run, read_jsonl(log_dir / run))
