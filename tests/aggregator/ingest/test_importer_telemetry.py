"""``rankwatch import`` of an agent's JSONL holding telemetry records: a store that does not
keep telemetry yet takes the rest and counts what it left; a sink that stores telemetry gets
the records decoded."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire.records import Record, TelemetryRecord
from rankwatch.aggregator.ingest.importer import import_into_store, import_paths
from rankwatch.cli.importing import describe


def jsonl_with_telemetry(tmp_path: Path) -> Path:
    mon = Monitor(
        run="imp", rank=0, world_size=1, log_dir=tmp_path / "logs", telemetry="host,0.05s"
    )
    deadline = time.monotonic() + 10
    step = 0
    while mon.jsonl_path.read_text().count('"telemetry"') < 3 and time.monotonic() < deadline:
        step += 1
        mon.log(step, loss=1.0)
        time.sleep(0.02)
    mon.close()
    return mon.jsonl_path


def test_a_store_without_telemetry_takes_the_rest_and_says_what_it_left(tmp_path: Path) -> None:
    path = jsonl_with_telemetry(tmp_path)
    lines = path.read_text().splitlines()
    telemetry = sum('"kind":"telemetry"' in line for line in lines)
    (summary,) = import_into_store([path], tmp_path / "data")
    assert summary.bad == 0 and summary.read == len(lines)
    assert summary.telemetry == telemetry >= 3
    assert summary.accepted == len(lines) - telemetry
    assert f"{telemetry} telemetry records not imported" in str(summary)
    assert describe(summary).endswith(f", {telemetry} telemetry records skipped (not stored yet)")


class Keeping:
    stores_telemetry = True

    def __init__(self) -> None:
        self.got: list[Record] = []

    def add(self, records: Sequence[Record]) -> int:
        self.got.extend(records)
        return len(records)


def test_a_sink_that_stores_telemetry_gets_it(tmp_path: Path) -> None:
    path = jsonl_with_telemetry(tmp_path)
    sink = Keeping()
    (summary,) = import_paths([path], sink)
    tele = [r for r in sink.got if isinstance(r, TelemetryRecord)]
    assert len(tele) >= 3 and summary.telemetry == 0 and summary.accepted == summary.read
    assert all(r.source == "host" and r.values["host/rss_bytes"] > 0 for r in tele)
