"""Metric sources: polled off the training thread, sent as step records, stopped when they fail."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.sources import SOURCES_ENV, SourceRegistry, resolve
from rankwatch.agent.sources.process import ProcessSource
from rankwatch.agent.wire import records

from .conftest import Router


class Counting:
    """A source that returns ``values`` (or raises ``error``) and counts its polls."""

    def __init__(self, name: str, values: Mapping[str, Any], error: Exception | None = None):
        self.name = name
        self.interval_s = 0.02
        self.values = values
        self.error = error
        self.calls = 0
        self.threads: set[str] = set()

    def sample(self, now: float) -> Mapping[str, Any]:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.error is not None:
            raise self.error
        return self.values


def source_steps(received: list[records.Record], prefix: str) -> list[records.StepRecord]:
    return [
        r
        for r in received
        if isinstance(r, records.StepRecord) and any(k.startswith(prefix) for k in r.metrics)
    ]


def train(mon: Monitor, steps: int, pace_s: float = 0.03) -> None:
    for step in range(1, steps + 1):
        mon.log(step, loss=1.0 / step)
        time.sleep(pace_s)


def test_process_source_values_arrive(router: Router, tmp_path: Path) -> None:
    with Monitor(
        run="src", addr=router.addr, log_dir=tmp_path, sources=[ProcessSource(0.02)]
    ) as mon:
        train(mon, 10)
    got = source_steps(
        router.wait_for(lambda rs: len(source_steps(rs, "process/")) >= 3), "process/"
    )
    for rec in got:
        assert rec.rank == 0 and rec.epoch is None and "loss" not in rec.metrics
        assert 1e6 < rec.metrics["process/rss_bytes"] < 1e12
        assert rec.metrics["process/cpu_s"] > 0
    assert len({r.step for r in got}) == len(got)  # at most one sample per step
    assert any("process/cpu_cores" in r.metrics for r in got)  # from the second sample on
    lines = (tmp_path / "src" / "rank0.jsonl").read_text().splitlines()
    in_jsonl = source_steps([records.from_json_line(x) for x in lines], "process/")
    assert [r.seq for r in got] == [r.seq for r in in_jsonl][: len(got)]


def test_a_failing_source_is_said_once_and_stopped(
    router: Router, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = Counting("bad", {}, error=OSError("no such device"))
    good = Counting("good", {"temp_c": 41.5, "nan": math.nan, "text": "hot"})
    caplog.set_level(logging.WARNING, "rankwatch.agent")
    with Monitor(run="bad", addr=router.addr, log_dir=tmp_path, sources=[bad, good]) as mon:
        train(mon, 8)
        assert mon._sampler is not None and [s.name for s in mon._sampler.registry.sources()] == [
            "good"
        ]
    assert bad.calls == 1 and good.calls > 3
    assert bad.threads == good.threads == {"rankwatch-sampler"}
    failed = [r.getMessage() for r in caplog.records if "'bad' failed" in r.getMessage()]
    assert failed == [
        "rankwatch: metric source 'bad' failed and was stopped: OSError('no such device')"
    ]
    skipped = [r.getMessage() for r in caplog.records if "good/text" in r.getMessage()]
    assert len(skipped) == 1 and "is not a number" in skipped[0]
    got = source_steps(router.wait_for(lambda rs: len(source_steps(rs, "good/")) >= 2), "good/")
    assert got[0].metrics["good/temp_c"] == 41.5 and math.isnan(got[0].metrics["good/nan"])
    assert set(got[0].metrics) == {"good/temp_c", "good/nan"}
    steps = [
        r for r in router.received if isinstance(r, records.StepRecord) and "loss" in r.metrics
    ]
    assert len(steps) == 8  # training went on


def test_off_by_default_and_named_by_the_environment(
    make_monitor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCES_ENV, raising=False)
    assert make_monitor()._sampler is None
    monkeypatch.setenv(SOURCES_ENV, "process, ")
    mon = make_monitor(sources=["process"])  # named twice: one source
    assert mon._sampler is not None
    assert [s.name for s in mon._sampler.registry.sources()] == ["process"]
    mon.close()
    assert not mon._sampler._thread.is_alive()
    monkeypatch.setenv(SOURCES_ENV, "gpu")
    with pytest.raises(ValueError, match=r"unknown metric source 'gpu' \(built-in: process\)"):
        make_monitor()


@pytest.mark.parametrize(
    ("name", "interval", "message"),
    [
        ("", 1.0, "not usable"),
        ("a/b", 1.0, "contains /"),
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


def test_nothing_is_sent_before_the_first_step(make_monitor: Any) -> None:
    src = Counting("early", {"v": 1.0})
    mon = make_monitor(sources=[src])
    deadline = time.monotonic() + 5
    while src.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.close()
    text = mon.jsonl_path.read_text()
    assert src.calls >= 3 and "early/v" not in text
