"""1,023 to 1,025 user metrics, with and without a batch size: a real Monitor sends to a real
aggregator (ZeroMQ, DuckDB in tmp_path) and every step is accepted, none refused; the agent
says what it dropped, once per name set, and counts it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import MAX_METRICS, from_json_line
from rankwatch.aggregator.ingest.importer import import_paths
from rankwatch.aggregator.ingest.receiver import Receiver
from rankwatch.aggregator.service import Aggregator, ServeConfig

from tests.polling import wait_until

from .test_receiver import collect, step

STEPS = 5


class Count:
    def __init__(self) -> None:
        self.n = 0

    def add(self, records: list[object]) -> int:
        self.n += len(records)
        return len(records)


@pytest.mark.parametrize("batch_size", [None, 32.0])
@pytest.mark.parametrize("user_metrics", [MAX_METRICS - 1, MAX_METRICS, MAX_METRICS + 1])
def test_every_step_is_stored_whatever_the_metric_count(
    tmp_path: Path, user_metrics: int, batch_size: float | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rankwatch.agent")
    config = ServeConfig(
        data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
        flush_interval_s=0.05, console_alerts=False,
    )  # fmt: skip
    values = {f"m{i:04d}": float(i) for i in range(user_metrics)}
    with Aggregator(config) as agg:
        addr = f"127.0.0.1:{agg.ingest_port}"
        with Monitor("many", 0, 1, addr, tmp_path / "logs", batch_size=batch_size) as mon:
            for step in range(STEPS):
                mon.log(step, **values)
            dropped = mon.metrics_dropped
            path = mon.jsonl_path
        wait_until(lambda: agg.counters()["records_accepted"] >= STEPS + 2)  # + start, end
        counters = agg.counters()
    assert counters["records_accepted"] == STEPS + 2 and counters["ingest_bad_records"] == 0
    lines = [from_json_line(line) for line in path.read_text().splitlines()]
    steps = [r for r in lines if r.kind == "step"]
    assert len(steps) == STEPS and all(len(r.metrics) <= MAX_METRICS for r in steps)  # type: ignore[union-attr]
    assert "step_time" in steps[-1].metrics  # type: ignore[union-attr]
    kept = MAX_METRICS - 2  # room for step_time and throughput, with a batch size or not
    assert dropped == STEPS * max(0, user_metrics - kept)
    warned = [r.message for r in caplog.records if "metrics in one log()" in r.message]
    assert len(warned) == (1 if dropped else 0)
    if dropped:
        assert f"the last {user_metrics - kept} of these names are dropped" in warned[0]
    sink = Count()
    summary = import_paths([path], sink)[0]  # the JSONL imports whole too
    assert summary.bad == 0 and sink.n == len(lines)


def test_a_record_over_the_limit_is_refused_loudly_naming_its_sender(
    dealer: Callable[[], zmq.Socket], receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rankwatch.receiver")
    wire = records.to_wire(step(0, 1))
    wire["metrics"] = {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}
    dealer().send(records.encode_frame([wire, records.to_wire(step(0, 2))]))
    assert [r.seq for r in collect(receiver, 1)] == [2]
    assert receiver.counters()["reasons"] == {"field": 1}
    (line,) = [r.message for r in caplog.records if "dropped a bad record" in r.message]
    assert f"{MAX_METRICS + 1} metrics in one record" in line and "run 'r1', rank 0" in line
