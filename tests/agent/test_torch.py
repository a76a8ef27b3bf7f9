"""PyTorch helpers: grad_norm on real tensors, and the DDP hook across two real gloo ranks."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

torch = pytest.importorskip("torch")

from rankwatch.agent.torch import grad_norm  # noqa: E402

pytestmark = pytest.mark.torch


def with_grads(*grads: list[float]) -> list[Any]:
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(len(g)))
        p.grad = torch.tensor(g)
        params.append(p)
    return params


@pytest.mark.parametrize(
    ("grads", "norm_type", "expected"),
    [
        (([3.0], [4.0]), 2.0, 5.0),
        (([3.0, -4.0], [12.0]), 2.0, 13.0),
        (([1.0, -2.0], [3.0]), 1.0, 6.0),
        (([1.0, -7.0], [3.0]), math.inf, 7.0),
        (([1.0], [math.nan]), 2.0, math.nan),
        (([math.inf], [1.0]), 2.0, math.inf),
    ],
)
def test_grad_norm(grads: tuple[list[float], ...], norm_type: float, expected: float) -> None:
    result = grad_norm(with_grads(*grads), norm_type)
    assert type(result) is float
    assert result == pytest.approx(expected, nan_ok=True)


def test_grad_norm_of_a_module_matches_clip_grad_norm() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    model(torch.randn(4, 5)).pow(2).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9).item()
    assert grad_norm(model) == pytest.approx(expected, rel=1e-6)
    assert grad_norm(model.parameters()) == pytest.approx(expected, rel=1e-6)


def test_grad_norm_without_grads_and_of_one_tensor() -> None:
    assert grad_norm(torch.nn.Linear(2, 2)) == 0.0
    assert grad_norm([]) == 0.0
    (p,) = with_grads([6.0, 8.0])
    assert grad_norm(p) == 10.0


def test_grad_norm_of_sparse_gradients() -> None:
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 1, 4])).sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad.is_sparse
    assert grad_norm(emb) == pytest.approx(emb.weight.grad.to_dense().norm().item())


DDP_RANK = """
import copy, json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from rankwatch.agent import Monitor
from rankwatch.agent.torch import grad_norm, install_local_grad_norm_hook

rank, port, log_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
ref = copy.deepcopy(model)  # the same weights without DDP: its grads are the local ones
ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets from the second step on
mon = Monitor(run="ddp", rank=rank, world_size=2, log_dir=log_dir)
state = install_local_grad_norm_hook(ddp, mon)
torch.manual_seed(100 + rank)
out = []
for step in (1, 2):
    x, y = torch.randn(32, 8) * (1 + 4 * rank), torch.randn(32, 1)  # rank 1: bad data
    ddp.zero_grad(); ref.zero_grad()
    loss = ((ddp(x) - y) ** 2).mean()
    loss.backward()
    ((ref(x) - y) ** 2).mean().backward()
    out.append({"hook": float(state.value), "local": grad_norm(ref), "reduced": grad_norm(ddp)})
    mon.log(step, loss=loss.detach())
    with torch.no_grad():  # keep ref in step with the all-reduced model
        for p, q in zip(ref.parameters(), ddp.module.parameters()):
            p.copy_(q)
mon.close()
print(json.dumps(out), flush=True)
# Both ranks leave together: a rank tearing gloo down while the other still talks to it
# aborts ("terminate called without an active exception"), about one run in six. Even
# then, rarely, a gloo or TCPStore thread is still joinable when the interpreter's C++
# destructors run (rank 0 hosts the store) and aborts the same way: leave without them.
dist.barrier()
dist.destroy_process_group()
sys.stderr.flush()
os._exit(0)
"""


def _free_port() -> int:
    import zmq

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.close(linger=0)
    return port


def test_ddp_hook_records_the_local_norm_before_the_all_reduce(tmp_path: Path) -> None:
    script = tmp_path / "ddp_rank.py"
    script.write_text(DDP_RANK)
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(port), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    for rank, per_step in enumerate(results):
        for step in per_step:
            assert step["hook"] == pytest.approx(step["local"], rel=1e-5)
        lines = (tmp_path / "ddp" / f"rank{rank}.jsonl").read_text().splitlines()
        logged = [r for r in map(records.from_json_line, lines) if r.kind == "step"]
        assert [r.metrics["grad_norm_local"] for r in logged] == pytest.approx(
            [s["hook"] for s in per_step], rel=1e-6
        )
    for step in (0, 1):
        # After the all-reduce both ranks hold the same gradients; before it, rank 1 stands out.
        assert results[0][step]["reduced"] == pytest.approx(results[1][step]["reduced"])
        assert results[1][step]["local"] > 2 * results[0][step]["local"]


TORCHRUN_RANK = """
from rankwatch.agent import Monitor
with Monitor(log_dir="logs") as mon:  # everything from torchrun's environment
    mon.log(1, loss=1.0)
"""


@pytest.mark.parametrize("standalone", [False, True])
def test_torchrun_ranks_share_one_derived_run(tmp_path: Path, standalone: bool) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed")
    (tmp_path / "train.py").write_text(TORCHRUN_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "MASTER_"))}
    env["RANKWATCH_ADDR"] = "ipc://" + str(tmp_path / "nobody")
    launch = ["--standalone"] if standalone else ["--master-port", str(_free_port())]

    def run_once() -> set[Path]:
        before = set((tmp_path / "logs").glob("*")) if (tmp_path / "logs").exists() else set()
        proc = subprocess.run(
            [str(torchrun), "--nproc-per-node=2", *launch, "train.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return set((tmp_path / "logs").glob("*")) - before

    (first,) = run_once()  # one folder for both ranks
    # script, torchrun's start (UTC), suffix: readable, never the rendezvous uuid
    assert re.fullmatch(r"train-\d{4}-\d{4}-[0-9a-f]{4}", first.name), first.name
    assert sorted(p.name for p in first.iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    for rank in (0, 1):
        lines = (first / f"rank{rank}.jsonl").read_text().splitlines()
        recs = [records.from_json_line(line) for line in lines]
        assert {(r.rank, getattr(r, "world_size", 2)) for r in recs} == {(rank, 2)}
    (second,) = run_once()  # a second launch never merges with the first
    assert second != first
