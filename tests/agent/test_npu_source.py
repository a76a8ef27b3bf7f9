"""The npu source against a stand-in ``npu-smi`` put first on PATH, printing output recorded
from Ascend machines (tests/fixtures/npu_smi, SOURCES.md says where each file comes from): the
910 and 310P layouts, and a missing, hanging, failing and garbage-printing tool."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.sources import Reading, SourceError
from rankwatch.agent.sources import npu as npu_mod
from rankwatch.agent.sources.npu import (
    Chip,
    NpuSource,
    chip_fields,
    logic_device,
    parse_map,
)
from rankwatch.agent.wire import records

FIXTURES = Path(__file__).parents[1] / "fixtures" / "npu_smi"
MIB = 1024 * 1024


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the stand-in first on PATH; returns the file its calls are logged to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "npu-smi"
    tool.write_text((FIXTURES / "standin.sh").read_text())
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("NPU_SMI_LOG", str(calls))
    monkeypatch.setenv("NPU_SMI_DIR", str(FIXTURES / "910"))
    return calls


def source(**env: str) -> NpuSource:
    return NpuSource(10.0, env={**os.environ, **env})


def test_910_values_for_the_ranks_card(smi: Path) -> None:
    got = source(DEVICE_ID="5").sample(0.0)
    assert isinstance(got, Reading) and got.device == "npu:5"
    assert got.values == {
        "aicore_pct": 0.0, "hbm_total_bytes": 32768.0 * MIB, "hbm_used_bytes": 0.0,
        "temp_c": 39.0, "power_w": 103.5, "health_ok": 1.0,
        "ecc_sbe_total": 0.0, "ecc_dbe_total": 0.0,
    }  # fmt: skip
    assert got.labels == {"card": "5", "chip": "0", "name": "Ascend 910A", "health": "OK"}
    assert smi.read_text().splitlines() == [
        "info -m", "info -t usages -i 5", "info -t temp -i 5 -c 0", "info -t power -i 5 -c 0",
        "info -t health -i 5 -c 0", "info -t ecc -i 5",
    ]  # fmt: skip


def test_the_id_map_is_read_once(smi: Path) -> None:
    src = source(DEVICE_ID="2")
    src.sample(0.0)
    src.sample(10.0)
    assert smi.read_text().splitlines().count("info -m") == 1


def test_a_card_in_alarm_says_its_error(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_SMI_HEALTH", "health_alarm.txt")
    got = source(DEVICE_ID="5").sample(0.0)
    assert isinstance(got, Reading)
    assert got.values["health_ok"] == 0.0 and got.labels["health"] == "Alarm"
    assert got.labels["health_error"].startswith("80C98001 node type=AIC, sensor type=RAS State")


def test_310p_ddr_and_an_unsupported_query_dropped_once(
    smi: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NPU_SMI_DIR", str(FIXTURES / "310p"))
    caplog.set_level(logging.WARNING, "rankwatch.agent")
    src = source(LOCAL_RANK="0")
    first, second = src.sample(0.0), src.sample(10.0)
    assert isinstance(first, Reading) and first.device == "npu:0"
    assert first.values == {
        "aicore_pct": 0.0, "aivector_pct": 0.0, "hbm_total_bytes": 44213.0 * MIB,
        "hbm_used_bytes": round(44213 * 0.04) * MIB, "temp_c": 54.0, "health_ok": 1.0,
        "ecc_sbe_total": 7.0, "ecc_dbe_total": 0.0,
    }  # fmt: skip
    assert first.labels["memory"] == "DDR" and first.labels["card"] == "32896"
    assert second == first
    said = [r.getMessage() for r in caplog.records if "power" in r.getMessage()]
    assert said == [
        "telemetry source 'npu': npu-smi info -t power -i 32896 -c 0 exited with 255 (This "
        "device does not support querying power.); its values are not sent"
    ]
    assert "info -t power -i 32896 -c 0" in smi.read_text()
    assert smi.read_text().count("-t power") == 1  # not asked again


@pytest.mark.parametrize(
    ("env", "logic"),
    [
        ({}, 0),
        ({"LOCAL_RANK": "3"}, 3),
        ({"DEVICE_ID": "0", "LOCAL_RANK": "3"}, 0),  # msrun's DEVICE_ID wins, 0 included
        ({"DEVICE_ID": "1", "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}, 5),
        ({"DEVICE_ID": "6", "ASCEND_RT_VISIBLE_DEVICES": "4,5"}, 6),  # not an index: as it is
        ({"LOCAL_RANK": "x"}, 0),
    ],
)
def test_the_ranks_logic_id(env: dict[str, str], logic: int) -> None:
    assert logic_device(env) == logic


def test_the_map_parser_reads_other_layouts() -> None:
    with_phy = "NPU ID Slot ID Chip ID Chip Phy-ID Chip Name\n5 22 0 5 Ascend950PR\n"
    assert parse_map(with_phy) == [Chip(5, 0, 5, 5, "Ascend950PR")]
    assert parse_map("no table here\n") == []
    two = (FIXTURES / "310p" / "m.txt").read_text()
    assert parse_map(two) == [Chip(32896, 0, 0, None, "Ascend 310P3")]  # the MCU row left out


def test_per_card_output_is_split_at_its_chip_lines() -> None:
    text = (
        "NPU ID : 1\nAicore Usage Rate(%) : 10\nChip ID : 0\n"
        "Aicore Usage Rate(%) : 90\nChip ID : 1\n"
    )
    assert chip_fields(text, 1) == {"Aicore Usage Rate(%)": "90"}
    assert chip_fields(text, 0)["Aicore Usage Rate(%)"] == "10"
    assert chip_fields(text, 2) == {}


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "npu-smi info -m printed no chip this source can read"),
        ("fail", "npu-smi info -m exited with 1 (dcmi module initialize failed. ret is -8005)"),
    ],
)
def test_a_broken_tool_is_a_clear_error(
    smi: Path, monkeypatch: pytest.MonkeyPatch, mode: str, message: str
) -> None:
    monkeypatch.setenv("NPU_SMI_MODE", mode)
    with pytest.raises(SourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        source().sample(0.0)


def test_a_device_missing_from_the_map_is_named(smi: Path) -> None:
    with pytest.raises(SourceError, match=r"logic id 9\) is not in npu-smi info -m \(logic ids 0,"):
        source(DEVICE_ID="9").sample(0.0)


def test_a_missing_tool_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceError, match="npu-smi is not on PATH"):
        source().sample(0.0)


def test_a_hanging_tool_is_killed_with_its_children(
    smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPU_SMI_MODE", "hang")
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"npu-smi info -m did not answer within 0.3 s"):
        NpuSource(10.0, env=dict(os.environ), timeout_s=0.3).sample(0.0)
    assert time.monotonic() - started < 3  # the sleeping grandchild held the pipe: killed too


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("missing", "npu-smi is not on PATH"),
        ("hang", "did not answer within 0.3 s"),
        ("fail", "npu-smi info -m exited with 1"),
        ("garbage", "printed no chip this source can read"),
    ],
)
def test_training_never_notices_and_the_rank_log_says_it_once(
    smi: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    words: str,
) -> None:
    if mode == "missing":
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    else:
        monkeypatch.setenv("NPU_SMI_MODE", mode)
    monkeypatch.setattr(npu_mod, "SMI_TIMEOUT_S", 0.3)
    caplog.set_level(logging.WARNING, "rankwatch.agent")
    mon = Monitor(run=f"npu-{mode}", log_dir=tmp_path / "logs", telemetry="npu")
    assert mon._sampler is not None
    slowest = 0.0
    for step in range(1, 41):
        started = time.perf_counter()
        mon.log(step, loss=1.0)
        slowest = max(slowest, time.perf_counter() - started)
        time.sleep(0.02)
    deadline = time.monotonic() + 5
    while mon._sampler.registry.names() and time.monotonic() < deadline:
        time.sleep(0.02)
    mon.close()
    assert mon._sampler.registry.names() == []  # stopped
    said = [r.getMessage() for r in caplog.records if "'npu' failed" in r.getMessage()]
    assert len(said) == 1 and words in said[0], said
    assert slowest < 0.05
    recs = [records.from_json_line(x) for x in mon.jsonl_path.read_text().splitlines()]
    assert [r.step for r in recs if isinstance(r, records.StepRecord)] == list(range(1, 41))
    assert not [r for r in recs if isinstance(r, records.TelemetryRecord)]


def test_npu_values_reach_the_jsonl_as_telemetry(
    smi: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("DEVICE_ID", "3")
    mon = Monitor(run="npu-ok", log_dir=tmp_path / "logs", telemetry="npu")
    deadline = time.monotonic() + 10
    while "telemetry" not in mon.jsonl_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    mon.close()
    recs = [records.from_json_line(x) for x in mon.jsonl_path.read_text().splitlines()]
    (tel,) = [r for r in recs if isinstance(r, records.TelemetryRecord)]
    assert (tel.source, tel.device) == ("npu", "npu:3")
    assert tel.values["npu/temp_c"] == 39.0 and tel.labels["npu/health"] == "OK"
