"""The memory source reads the counters of frameworks already imported, never importing one.
Which counters and which device name are tested with stand-ins of the two frameworks' memory
APIs (this machine has neither a CUDA device nor an Ascend one)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from rankwatch.agent.sources.memory import MemorySource


def test_nothing_imported_nothing_read_and_nothing_imported_by_reading() -> None:
    script = (
        "import sys\n"
        "from rankwatch.agent.sources.memory import MemorySource\n"
        "r = MemorySource(1.0, env={}).sample(0.0)\n"
        "print(dict(r.values), 'torch' in sys.modules, 'mindspore' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["{}", "False", "False"], out.stderr


def counters(allocated: float) -> SimpleNamespace:
    return SimpleNamespace(
        memory_allocated=lambda: allocated,
        max_memory_allocated=lambda: 2 * allocated,
        memory_reserved=lambda: 3 * allocated,
    )


def test_torch_cuda_counters_of_the_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = counters(1e9)
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 1
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.delitem(sys.modules, "mindspore", raising=False)
    got = MemorySource(1.0, env={"CUDA_VISIBLE_DEVICES": "2,3"}).sample(0.0)
    assert got.values == {
        "allocated_bytes": 1e9, "max_allocated_bytes": 2e9, "reserved_bytes": 3e9,
    }  # fmt: skip
    assert got.device == "gpu:3" and got.labels == {"framework": "torch"}


def test_mindspore_on_ascend_and_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    target = {"device_target": "Ascend"}
    ms = SimpleNamespace(runtime=counters(5e8), get_context=target.__getitem__)
    monkeypatch.setitem(sys.modules, "mindspore", ms)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace())  # no cuda, no npu
    env = {"DEVICE_ID": "1", "ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    got = MemorySource(1.0, env=env).sample(0.0)
    assert got.values["reserved_bytes"] == 1.5e9 and got.device == "npu:5"
    target["device_target"] = "CPU"  # MindSpore 2.10 reads 0 there: left out
    assert MemorySource(1.0, env=env).sample(0.0).values == {}
