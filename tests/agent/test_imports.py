"""``import rankwatch.agent`` needs nothing but pyzmq and msgpack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rankwatch.agent.wire import records

BLOCKED = (
    "mindspore", "torch", "numpy", "fastapi", "duckdb", "pyarrow",
    "lightning", "transformers", "accelerate",
)  # fmt: skip

SCRIPT = """
import json, sys
from fractions import Fraction

BLOCKED = set(sys.argv[3].split(","))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"blocked for this test: {name}")
        return None

sys.meta_path.insert(0, Blocker())

import rankwatch.agent
from rankwatch.agent import Monitor

class torch_lookalike:  # a module name that merely starts with "torch"
    def __float__(self):
        return 2.0

torch_lookalike.__module__ = "torchvision_like"

with Monitor(run="imports", log_dir=sys.argv[1], addr=sys.argv[2], sources=["process"]) as mon:
    mon.log(1, loss=0.5, frac=Fraction(1, 4), other=torch_lookalike(), nan=float("nan"))
    mon.event("eval", step=1, accuracy=0.9)
    with mon.pause(1.0):
        pass
import rankwatch.agent.torch  # the adapter module itself imports torch lazily
import rankwatch.agent.adapter  # what the Lightning and Trainer adapters share: no framework
try:
    rankwatch.agent.torch.grad_norm([])
except ImportError as exc:
    lazy = str(exc)
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
adapters = sorted(m for m in sys.modules if m in (
    "rankwatch.agent.mindspore", "rankwatch.agent.lightning", "rankwatch.agent.hf"))
print(json.dumps({"loaded": loaded, "adapters": adapters, "lazy": lazy,
                  "exports": rankwatch.agent.__all__}))
"""


def test_agent_imports_and_runs_without_frameworks(tmp_path: Path) -> None:
    script = tmp_path / "blocked.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path),
            "ipc://" + str(tmp_path / "s"),
            ",".join(BLOCKED),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["loaded"] == [] and out["adapters"] == []
    assert "blocked for this test: torch" in out["lazy"]
    assert "Monitor" in out["exports"]
    lines = (tmp_path / "imports" / "rank0.jsonl").read_text().splitlines()
    recs = [records.from_json_line(line) for line in lines]
    step = next(r for r in recs if isinstance(r, records.StepRecord))
    assert step.metrics["frac"] == 0.25 and step.metrics["other"] == 2.0
    kinds = [getattr(r, "event", r.kind) for r in recs]
    assert kinds == ["start", "step", "eval", "pause", "resume", "end"]


def test_package_exports_monitor() -> None:
    import rankwatch.agent
    from rankwatch.agent.monitor import Monitor

    assert rankwatch.agent.Monitor is Monitor
    assert rankwatch.agent.DEFAULT_INGEST_PORT == 8671
