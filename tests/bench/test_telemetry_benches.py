"""bench/telemetry_cost.py and bench/gpu_telemetry.py run to the end (small sizes)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_telemetry_cost_prints_every_source_against_its_baseline() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "telemetry_cost.py"), "--samples", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert " 1.0x " in rows["baseline"]
    for name in ("host", "npu", "memory"):  # npu: against the tests' stand-in npu-smi
        assert name in rows and " us " in rows[name], done.stdout
    assert "gpu" in rows


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="has a GPU driver")
def test_gpu_telemetry_without_a_gpu_says_so_and_exits_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "gpu_telemetry.py")], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no NVIDIA GPU to read here: ")
