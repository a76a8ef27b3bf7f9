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
    while (
        mon.jsonl_path.read_text().count('"kind":"telemetry"') < 3 and time.monotonic() < deadline
    ):
        step += 1
        mon.log(step, loss=1.0)
        time.sleep(0.02)
    mon.close()
    return mon.jsonl_path


def test_the_store_keeps_the_telemetry_of_an_imported_jsonl(tmp_path: Path) -> None:
    from rankwatch.aggregator.store.db import Store

    path = jsonl_with_telemetry(tmp_path)
    lines = path.read_text().splitlines()
    telemetry = sum('"kind":"telemetry"' in line for line in lines)
    (summary,) = import_into_store([path], tmp_path / "data")
    assert summary.bad == 0 and summary.read == len(lines) == summary.accepted
    assert summary.telemetry == 0 and "telemetry" not in str(summary)
    with Store(tmp_path / "data") as store:
        rss = store.telemetry_series("imp", "host/rss_bytes")[0]["value"]
        assert len(rss) == telemetry >= 3 and min(rss) > 0  # real psutil values, read back
    (again,) = import_into_store([path], tmp_path / "data")  # seqs dedupe telemetry too
    assert again.accepted == 0 and again.duplicates == len(lines)


class Skipping:
    def __init__(self) -> None:
        self.got: list[Record] = []

    def add(self, records: Sequence[Record]) -> int:
        self.got.extend(records)
        return len(records)


def test_a_sink_that_does_not_store_telemetry_is_not_sent_it(tmp_path: Path) -> None:
    path = jsonl_with_telemetry(tmp_path)
    (summary,) = import_paths([path], Skipping())
    assert summary.telemetry >= 3
    assert describe(summary).endswith(
        f", {summary.telemetry} telemetry records skipped (not stored yet)"
    )


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
