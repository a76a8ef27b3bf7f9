"""Telemetry in the real DuckDB store: rows, label changes, rollups for long windows, export."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from rankwatch.agent.wire.records import TelemetryRecord
from rankwatch.aggregator.store.db import Store


def rec(rank: int, seq: int, t: float, temp: float, health: str = "OK") -> TelemetryRecord:
    return TelemetryRecord(
        "r", rank, seq, t, f"node{rank // 2}", 100 + rank, "gpu", f"gpu:{rank % 2}",
        {"gpu/temp_c": temp, "gpu/util_pct": 90.0}, {"gpu/throttle": health},
    )  # fmt: skip


def test_samples_are_stored_with_their_seqs_and_labels_where_they_change(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.append([rec(k, i + 1, 100.0 + 10 * i, 60.0 + k) for k in range(2) for i in range(5)])
        store.append([rec(0, 6, 150.0, math.nan, "thermal")])
        store.flush()
        series = store.telemetry_series("r", "gpu/temp_c")
        assert series[1] == {"time": [100.0, 110.0, 120.0, 130.0, 140.0], "value": [61.0] * 5}
        assert math.isnan(series[0]["value"][-1])
        assert store.telemetry_names("r") == ["gpu/temp_c", "gpu/util_pct"]
        assert ("r", 0, 0, 1, 6) in store.seen_seqs()  # dedupe after a restart knows them
        labels = [(x["rank"], x["name"], x["value"]) for x in store.telemetry_labels("r")]
        assert sorted(labels) == sorted([
            (0, "gpu/throttle", "OK"), (0, "host", "node0"), (1, "gpu/throttle", "OK"),
            (1, "host", "node0"), (0, "gpu/throttle", "thermal"),
        ])  # fmt: skip
        store.append([rec(0, 7, 160.0, 70.0, "thermal"), rec(0, 8, 170.0, 70.0, "OK")])
        store.flush()  # one more change, not the repeat
        assert len(store.telemetry_labels("r")) == 6
        assert store.telemetry_latest("r")[0]["gpu/temp_c"] == 70.0
        assert store.runs()[0]["ranks"] == 2
    with Store(tmp_path) as store:  # reopened: the summaries come back from the tables
        assert store.telemetry_runs()["r"]["rows"] == 2 * (8 + 5)
        assert store.telemetry_series("r", "gpu/util_pct")[0]["time"][-1] == 170.0


def test_a_long_window_reads_the_rollups_and_keeps_a_spike(tmp_path: Path) -> None:
    hours = 6
    n = hours * 360
    with Store(tmp_path) as store:
        for start in range(0, n, 720):  # flushes as a live run makes them
            store.append([
                rec(k, i + 1, 1000.0 + 10 * i, 99.0 if (k, i) == (1, 1234) else 60.0)
                for k in range(4) for i in range(start, min(n, start + 720))
            ])  # fmt: skip
            store.flush()
        store.append([rec(3, n + 1, 1000.0 + 10 * 17, 61.5)])  # late, into a rolled-up bucket
        store.flush()
        series = store.telemetry_series("r", "gpu/temp_c", max_points=200)
        assert set(series) == {0, 1, 2, 3}
        assert all(len(s["time"]) <= 200 for s in series.values())
        assert max(series[1]["value"]) == 99.0 and max(series[0]["value"]) == 60.0
        assert max(series[3]["value"]) == 61.5
        assert series[1]["time"][series[1]["value"].index(99.0)] == 1000.0 + 12340
        # the same window raw, for a short span, in full
        short = store.telemetry_series("r", "gpu/temp_c", ranks=[1], start=13000, end=13600)
        assert list(short) == [1] and len(short[1]["time"]) == 61
        before = store.telemetry_runs()["r"]
    with Store(tmp_path) as store:  # reopened: summed from the coarse rollup and the raw tail
        assert store.telemetry_runs()["r"] == before
        assert before["rows"] == 2 * (4 * n + 1) and before["first_time"] == 1000.0
        assert store.telemetry_series("r", "gpu/temp_c", max_points=200) == series


def test_export_writes_the_telemetry_rows(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.append([rec(0, 1, 5.0, 60.0), rec(1, 1, 6.0, 61.0)])
        store.flush()
        out = tmp_path / "t.csv"
        assert store.export_telemetry("r", out, "csv") == 4
    rows = list(csv.DictReader(out.open()))
    assert rows[0] == {"run": "r", "rank": "0", "inc": "0", "time": "5.0", "source": "gpu",
                       "device": "gpu:0", "name": "gpu/temp_c", "value": "60.0"}  # fmt: skip


def test_the_band_across_ranks_over_time(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.append([rec(k, i + 1, 1000.0 + 10 * i + k, 60.0 + k) for k in range(5)
                      for i in range(30)])  # fmt: skip
        store.flush()
        band = store.telemetry_band("r", "gpu/temp_c", max_points=40)  # from the raw rows
        assert 28 <= len(band["time"]) <= 31
        inner = slice(1, -1)  # the first and last buckets hold some of the ranks only
        assert set(band["median"][inner]) == {62.0} and set(band["max"][inner]) == {64.0}
        assert set(band["min"][inner]) == {60.0}
        coarse = store.telemetry_band("r", "gpu/temp_c", max_points=10)  # rollups and raw
        assert len(coarse["time"]) <= 11 and all(61 <= m <= 63 for m in coarse["median"])
        assert store.telemetry_band("r", "nope") == {k: [] for k in band}


def test_rankwatch_export_writes_the_telemetry_beside_the_steps(tmp_path: Path) -> None:
    import subprocess
    import sys

    from rankwatch.agent.wire.records import StepRecord

    data = tmp_path / "data"
    with Store(data) as store:
        store.append([rec(0, 1, 5.0, 60.0), StepRecord("r", 0, 2, 6.0, 1, "n", 1, 1, None,
                                                        {"loss": 1.0})])  # fmt: skip
    out = tmp_path / "r.csv"
    done = subprocess.run(
        [sys.executable, "-m", "rankwatch.cli.main", "export", "--run", "r", "--out", str(out),
         "--data", str(data)], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"wrote 2 telemetry rows of run 'r' to {tmp_path / 'r.telemetry.csv'}" in done.stdout
    assert (tmp_path / "r.telemetry.csv").read_text().count("\n") == 3
