"""The gpu source on a machine without a GPU: the library absent, the library without a driver
(the real nvidia-ml-py), and the real binding against a stand-in libnvidia-ml (compiled from
tests/fixtures/nvml_stub) for the values, a driver not loaded, a missing GPU and a hot card."""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.sources import SourceError
from rankwatch.agent.sources.gpu import GpuSource, gpu_index, throttle_label
from rankwatch.agent.wire import records

STUB = Path(__file__).parents[1] / "fixtures" / "nvml_stub" / "nvml_stub.c"
HAS_PYNVML = importlib.util.find_spec("pynvml") is not None
HAS_DRIVER = ctypes.util.find_library("nvidia-ml") is not None


def test_without_the_library_the_source_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what import finds when it is absent
    with pytest.raises(SourceError, match=r"needs nvidia-ml-py.*pip install rankwatch\[gpu\]"):
        GpuSource(1.0, env={}).sample(0.0)


@pytest.mark.skipif(not HAS_PYNVML or HAS_DRIVER, reason="needs nvidia-ml-py and no driver")
def test_the_real_library_without_a_driver_says_so() -> None:
    with pytest.raises(
        SourceError, match=r"NVML did not start \(libnvidia-ml not found: no NVIDIA"
    ):
        GpuSource(1.0, env={}).sample(0.0)


def test_a_monitor_on_a_machine_without_a_gpu_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if HAS_DRIVER:
        pytest.skip("this machine has an NVIDIA driver")
    caplog.set_level(logging.WARNING, "rankwatch.agent")
    mon = Monitor(run="gpu", log_dir=tmp_path, telemetry="gpu")
    assert mon._sampler is not None
    for step in range(1, 21):
        mon.log(step, loss=1.0)
        time.sleep(0.01)
    deadline = time.monotonic() + 5
    while mon._sampler.registry.names() and time.monotonic() < deadline:
        time.sleep(0.02)
    mon.close()
    said = [r.getMessage() for r in caplog.records if "'gpu' failed" in r.getMessage()]
    assert len(said) == 1 and "GPU values are not sent" in said[0]
    recs = [records.from_json_line(x) for x in mon.jsonl_path.read_text().splitlines()]
    assert len([r for r in recs if isinstance(r, records.StepRecord)]) == 20


@pytest.mark.parametrize(
    ("env", "index"),
    [
        ({}, 0),
        ({"LOCAL_RANK": "1"}, 1),
        ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}, 6),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f3e,GPU-11aa"}, "GPU-8f3e"),
    ],
)
def test_the_ranks_gpu(env: dict[str, str], index: int | str) -> None:
    assert gpu_index(env) == index


def test_throttle_reasons_in_words() -> None:
    assert throttle_label(0) == ""
    assert throttle_label(0x1) == "idle"
    assert throttle_label(0x4 | 0x40) == "sw_power_cap,hw_thermal"


CASES = r"""
import json, os, sys
from rankwatch.agent.sources import SourceError
from rankwatch.agent.sources.gpu import GpuSource

def run(env, **stub):
    for key in ("NVML_STUB_INIT", "NVML_STUB_HOT"):
        os.environ.pop(key, None)
    os.environ.update(stub)
    src = GpuSource(1.0, env=env)
    try:
        got = src.sample(0.0)
        return {"values": got.values, "labels": dict(got.labels), "device": got.device,
                "skipped": sorted(src._skip)}
    except SourceError as exc:
        return {"error": str(exc)}

print(json.dumps({
    "ok": run({"CUDA_VISIBLE_DEVICES": "1"}),
    "hot": run({}, NVML_STUB_HOT="1"),
    "no_gpu": run({"LOCAL_RANK": "5"}),
    "driver": run({}, NVML_STUB_INIT="9"),
}))
"""


@pytest.mark.skipif(not HAS_PYNVML or shutil.which("cc") is None, reason="needs pynvml and cc")
def test_the_real_binding_against_a_stand_in_driver(tmp_path: Path) -> None:
    lib = tmp_path / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(STUB)], check=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", CASES], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    ok = got["ok"]
    assert ok["device"] == "gpu:1"
    assert ok["values"] == {
        "util_pct": 97.0, "mem_used_bytes": 70e9, "mem_total_bytes": 85899345920.0,
        "temp_c": 61.0, "power_w": 612.345, "power_limit_w": 700.0, "sm_clock_mhz": 1980.0,
        "throttle_mask": 0.0, "ecc_corrected_total": 12.0, "ecc_uncorrected_total": 1.0,
        "remapped_rows_total": 3.0, "pcie_replay_total": 5.0,
    }  # fmt: skip
    assert ok["labels"] == {"throttle": ""}
    assert ok["skipped"] == ["retired_dbe", "retired_sbe"]  # Ampere and later: not supported
    hot = got["hot"]
    assert hot["values"]["temp_c"] == 94.0 and hot["values"]["sm_clock_mhz"] == 1275.0
    assert hot["values"]["throttle_mask"] == 0x60
    assert hot["labels"] == {"throttle": "sw_thermal,hw_thermal"}
    assert got["no_gpu"]["error"].startswith("telemetry source 'gpu': no GPU 5 (")
    assert got["driver"] == {
        "error": "telemetry source 'gpu': NVML did not start (the NVIDIA driver is not "
        "loaded); GPU values are not sent"
    }
