"""Telemetry sources: polled off the training thread, sent as telemetry records (with their own
seqs, in frames of their own, in the JSONL), stopped when they fail; the telemetry setting."""

from __future__ import annotations

import itertools
import logging
import math
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.sources import (
    SOURCES_ENV,
    TELEMETRY_ENV,
    Reading,
    SourceError,
    SourceRegistry,
    Telemetry,
    detected,
    parse_telemetry,
    resolve,
)
from rankwatch.agent.sources.host import HostSource
from rankwatch.agent.wire import records

from .conftest import Router


class Counting:
    """A source that returns ``values`` (or raises ``error``) and counts its polls."""

    def __init__(
        self, name: str, values: Mapping[str, Any] | Reading, error: Exception | None = None
    ):
        self.name = name
        self.interval_s = 0.02
        self.values = values
        self.error = error
        self.calls = 0
        self.threads: set[str] = set()

    def sample(self, now: float) -> Mapping[str, Any] | Reading:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.error is not None:
            raise self.error
        return self.values


def telemetry(received: list[records.Record], source: str) -> list[records.TelemetryRecord]:
    return [r for r in received if isinstance(r, records.TelemetryRecord) and r.source == source]


def train(mon: Monitor, steps: int, pace_s: float = 0.03) -> None:
    for step in range(1, steps + 1):
        mon.log(step, loss=1.0 / step)
        time.sleep(pace_s)


def test_host_values_arrive_as_telemetry_records_and_match_the_jsonl(
    router: Router, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    with Monitor(
        run="src", addr=router.addr, log_dir=tmp_path, telemetry="host,0.05s", ckpt_dir=ckpt
    ) as mon:
        train(mon, 10)
    got = telemetry(router.wait_for(lambda rs: len(telemetry(rs, "host")) >= 3), "host")
    for rec in got:
        assert (rec.rank, rec.device, rec.host, rec.pid) == (0, "", mon.host, mon.pid)
        assert rec.inc == mon.incarnation
        assert 1e6 < rec.values["host/rss_bytes"] < 1e12
        assert rec.values["host/mem_available_bytes"] > 0
        assert rec.values["host/disk_free_log_bytes"] > 0
        assert rec.values["host/disk_free_ckpt_bytes"] > 0  # not made yet: its disk's
        assert rec.values["host/load1"] >= 0
    later = got[1].values
    assert 0 <= later["host/cpu_pct"] <= 100 and later["host/proc_cpu_pct"] >= 0
    assert later["host/net_rx_bytes_per_s"] >= 0 and later["host/net_tx_bytes_per_s"] >= 0
    assert "host/cpu_pct" not in got[0].values  # rates need a previous sample
    assert all(b.time > a.time for a, b in itertools.pairwise(got))
    assert 2 in router.versions and 1 in router.versions  # telemetry in frames of its own
    lines = (tmp_path / "src" / "rank0.jsonl").read_text().splitlines()
    on_disk = telemetry([records.from_json_line(x) for x in lines], "host")
    assert [r.seq for r in got] == [r.seq for r in on_disk][: len(got)]
    assert got[0] == on_disk[0]


def test_a_failing_source_is_said_once_and_stopped(
    router: Router, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = Counting("bad", {}, error=OSError("no such device"))
    good = Counting(
        "good", Reading({"temp_c": 41.5, "nan": math.nan, "text": "hot"}, {"state": "ok"}, "cpu")
    )
    caplog.set_level(logging.WARNING, "rankwatch.agent")
    with Monitor(
        run="bad", addr=router.addr, log_dir=tmp_path, sources=[bad, good], telemetry="off"
    ) as mon:
        train(mon, 8)
        assert mon._sampler is not None and mon._sampler.registry.names() == ["good"]
    assert bad.calls == 1 and good.calls > 3
    assert bad.threads == good.threads == {"rankwatch-sampler"}
    failed = [r.getMessage() for r in caplog.records if "'bad' failed" in r.getMessage()]
    assert failed == [
        "rankwatch: metric source 'bad' failed and was stopped: OSError('no such device')"
    ]
    skipped = [r.getMessage() for r in caplog.records if "good/text" in r.getMessage()]
    assert len(skipped) == 1 and "is not a number" in skipped[0]
    got = telemetry(router.wait_for(lambda rs: len(telemetry(rs, "good")) >= 2), "good")
    assert got[0].values["good/temp_c"] == 41.5 and math.isnan(got[0].values["good/nan"])
    assert set(got[0].values) == {"good/temp_c", "good/nan"}
    assert got[0].labels == {"good/state": "ok"} and got[0].device == "cpu"
    steps = [r for r in router.received if isinstance(r, records.StepRecord)]
    assert len(steps) == 8  # training went on


def test_samples_go_out_before_the_first_step_and_without_steps(make_monitor: Any) -> None:
    src = Counting("early", {"v": 1.0})
    mon = make_monitor(sources=[src])
    deadline = time.monotonic() + 5
    while src.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.close()
    recs = [records.from_json_line(x) for x in mon.jsonl_path.read_text().splitlines()]
    early = telemetry(recs, "early")
    assert len(early) >= 3 and all(r.values == {"early/v": 1.0} for r in early)
    seqs = [r.seq for r in recs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # the rank's one counter


def test_an_empty_sample_costs_no_record_and_no_seq(make_monitor: Any) -> None:
    src = Counting("idle", Reading({}))
    mon = make_monitor(sources=[src])
    deadline = time.monotonic() + 5
    while src.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.log(1, loss=1.0)
    mon.close()
    recs = [records.from_json_line(x) for x in mon.jsonl_path.read_text().splitlines()]
    assert not telemetry(recs, "idle")
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (None, Telemetry(None)),
        ("on", Telemetry(None)),
        (True, Telemetry(None)),
        ("off", Telemetry((), enabled=False)),
        (False, Telemetry((), enabled=False)),
        ("host", Telemetry(("host",))),
        ("host, npu ,host", Telemetry(("host", "npu"))),
        ("process", Telemetry(("host",))),  # the former source's name
        ("30s", Telemetry(None, 30.0)),
        ("500ms", Telemetry(None, 0.5)),
        ("2m", Telemetry(None, 120.0)),
        (5, Telemetry(None, 5.0)),
        ("gpu,memory,15", Telemetry(("gpu", "memory"), 15.0)),
        ("on,20s", Telemetry(None, 20.0)),
    ],
)
def test_the_telemetry_setting(setting: Any, expected: Telemetry) -> None:
    got = parse_telemetry(setting)
    assert (got.names, got.interval_s, got.enabled) == (
        expected.names, expected.interval_s, expected.enabled,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("hots", r"'hots' is neither a source \(host, npu, gpu, memory, on, off\) nor an interval"),
        ("0.01s", "must be at least 0.05 s"),
        (-1, "must be at least"),
        (math.inf, "must be at least"),
        ([1], "must be 'on', 'off', source names or seconds"),
    ],
)
def test_a_bad_telemetry_setting_says_what_is_wrong(setting: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_telemetry(setting)


def test_the_environment_sets_telemetry_and_a_bad_value_names_the_variable(
    make_monitor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TELEMETRY_ENV, "host,20s")
    mon = make_monitor()
    assert mon._sampler is not None and mon._sampler.registry.names() == ["host"]
    assert mon._sampler.registry.sources()[0].interval_s == 20.0
    mon.close()
    assert make_monitor(telemetry="off")._sampler is None  # the argument wins
    monkeypatch.setenv(TELEMETRY_ENV, "fast")
    with pytest.raises(ValueError, match="RANKWATCH_TELEMETRY='fast': telemetry setting"):
        make_monitor()


def test_on_starts_the_detected_sources(make_monitor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no npu-smi
    assert detected()[0] == "host" and "npu" not in detected() and detected()[-1] == "memory"
    mon = make_monitor(telemetry="on")
    assert mon._sampler is not None
    assert mon._sampler.registry.names() == detected()
    mon.close()


def test_sources_named_by_the_environment_join_the_telemetry(
    make_monitor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCES_ENV, "process, memory")
    mon = make_monitor(sources=["host"], telemetry="off")  # process is host: one source
    assert mon._sampler is not None and mon._sampler.registry.names() == ["host", "memory"]
    mon.close()
    assert not mon._sampler._thread.is_alive()
    monkeypatch.setenv(SOURCES_ENV, "tpu")
    with pytest.raises(ValueError, match=r"unknown metric source 'tpu' \(built-in: gpu, host"):
        make_monitor()


@pytest.mark.parametrize(
    ("name", "interval", "message"),
    [
        ("", 1.0, "not usable"),
        ("a/b", 1.0, "contains /"),
        ("s" * 65, 1.0, "65 chars, max 64"),
        ("ok", 0, "interval_s must be > 0"),
        ("ok", math.inf, "interval_s must be > 0"),
        ("ok", True, "must be seconds"),
    ],
)
def test_registry_refuses_sources_that_make_no_sense(
    name: str, interval: Any, message: str
) -> None:
    src = Counting(name, {})
    src.interval_s = interval
    with pytest.raises(ValueError, match=message):
        SourceRegistry().register(src)


def test_registry_refuses_a_duplicate_name() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        resolve([Counting("x", {}), Counting("x", {})], env="")


def test_host_source_without_psutil_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # what import finds when it is absent
    with pytest.raises(SourceError, match="needs psutil, which is not installed"):
        HostSource(1.0, log_dir=".").sample(0.0)
