"""``memory``: the framework's own device-memory counters, from frameworks the training script
has imported already (this never imports one).

MindSpore: ``mindspore.runtime.memory_allocated()``, ``max_memory_allocated()`` and
``memory_reserved()`` (MindSpore 2.3 and later), left out while the device target is CPU, where
they read 0. PyTorch: ``torch.cuda`` (or ``torch.npu``, torch_npu's) ``memory_allocated()``,
``max_memory_allocated()`` and ``memory_reserved()`` of the current device, once that backend is
initialised (asking before would initialise it). Values: ``allocated_bytes``,
``max_allocated_bytes``, ``reserved_bytes``; a process using neither framework sends nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .base import INTERVAL_S, Reading

_CALLS = (
    ("allocated_bytes", "memory_allocated"),
    ("max_allocated_bytes", "max_memory_allocated"),
    ("reserved_bytes", "memory_reserved"),
)


def _counters(module: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, call in _CALLS:
        fn = getattr(module, call, None)
        if fn is not None:
            out[name] = float(fn())
    return out


def _visible(env: Mapping[str, str], var: str, index: int) -> str:
    """The host-wide id of in-process device ``index`` (what the npu and gpu sources name)."""
    visible = [v.strip() for v in env.get(var, "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def mindspore_memory(env: Mapping[str, str]) -> Reading | None:
    ms = sys.modules.get("mindspore")
    runtime = getattr(ms, "runtime", None) if ms is not None else None
    if runtime is None:
        return None
    target = str(ms.get_context("device_target"))  # type: ignore[union-attr]
    if target.upper() == "CPU":
        return None
    device = "npu:" if target.lower() == "ascend" else "gpu:"
    index = env.get("DEVICE_ID", env.get("LOCAL_RANK", "0")).strip()
    var = "ASCEND_RT_VISIBLE_DEVICES" if device == "npu:" else "CUDA_VISIBLE_DEVICES"
    where = device + _visible(env, var, int(index) if index.isdigit() else 0)
    return Reading(_counters(runtime), {"framework": "mindspore"}, where)


def torch_memory(env: Mapping[str, str]) -> Reading | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for backend in ("cuda", "npu"):
        module: Any = getattr(torch, backend, None)
        initialized = getattr(module, "is_initialized", None)
        if initialized is None or not initialized():
            continue
        index = int(module.current_device())
        if backend == "cuda":
            where = "gpu:" + _visible(env, "CUDA_VISIBLE_DEVICES", index)
        else:
            where = "npu:" + _visible(env, "ASCEND_RT_VISIBLE_DEVICES", index)
        return Reading(_counters(module), {"framework": "torch"}, where)
    return None


class MemorySource:
    name = "memory"

    def __init__(self, interval_s: float = INTERVAL_S, env: Mapping[str, str] | None = None):
        self.interval_s = interval_s
        self._env = dict(os.environ if env is None else env)

    def sample(self, now: float) -> Reading:
        for read in (torch_memory, mindspore_memory):
            reading = read(self._env)
            if reading is not None and reading.values:
                return reading
        return Reading({})
