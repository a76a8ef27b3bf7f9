"""Exporting a run to CSV and Parquet, read back and compared with what went in."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import duckdb
import pytest
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.store.db import Store
from rankwatch.aggregator.store.export import ExportError, export_run, lay_out_hive

VALUES = [1.5, math.nan, math.inf, -math.inf, -0.25, 1e-300]


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "s.duckdb") as s:
        recs = [
            StepRecord("job", rank, i + 1, 100.0 + i, 2, "h", 1, i, None if i == 0 else 3,
                       {"loss": v, "lr": 0.1 * rank})
            for rank in range(2)
            for i, v in enumerate(VALUES)
        ]  # fmt: skip
        recs.append(StepRecord("other", 0, 1, 1.0, 1, "h", 1, 0, None, {"loss": 9.0}))
        s.append(recs)
        s.flush()
        yield s


def expected() -> list[tuple]:
    rows = []
    for rank in range(2):
        for i, v in enumerate(VALUES):
            for metric, value in sorted({"loss": v, "lr": 0.1 * rank}.items()):
                rows.append(("job", rank, i, None if i == 0 else 3, 100.0 + i, metric, value))
    return rows


def same(a: list[tuple], b: list[tuple]) -> bool:
    return repr(a) == repr(b)  # NaN-aware: repr(nan) == "nan"


def test_csv_round_trip(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "job.csv"
    assert export_run(store, "job", out) == 24
    with out.open(newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["run", "rank", "step", "epoch", "time", "metric", "value"]
        rows = [
            (r[0], int(r[1]), int(r[2]), int(r[3]) if r[3] else None, float(r[4]), r[5],
             float(r[6]))
            for r in reader
        ]  # fmt: skip
    assert same(rows, expected())
    assert "nan" in out.read_text().split()[3]  # NaN written as "nan"


def test_parquet_round_trip(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "job.data"
    assert export_run(store, "job", out, "parquet") == 24
    rows = duckdb.connect().execute(f"SELECT * FROM read_parquet('{out}')").fetchall()
    assert same(rows, expected())


def test_clear_errors(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"no run named 'nope'.*known runs: 'job', 'other'"):
        export_run(store, "nope", tmp_path / "x.csv")
    with pytest.raises(ExportError, match="unknown export format 'xlsx'"):
        export_run(store, "job", tmp_path / "x.xlsx")
    with pytest.raises(ExportError, match="not a directory"):
        export_run(store, "job", tmp_path / "missing" / "x.csv")


def test_hive_layout_by_run_and_rank(store: Store, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    for run in ("job", "other"):
        staged = tmp_path / f"{run}.parquet"
        export_run(store, run, staged, "parquet")
        assert lay_out_hive(staged, lake) == (24 if run == "job" else 1)
    folders = sorted(p.parent.relative_to(lake).as_posix() for p in lake.rglob("*.parquet"))
    assert folders == ["run=job/rank=0", "run=job/rank=1", "run=other/rank=0"]
    rows = (
        duckdb.connect()
        .execute(
            f"SELECT run, rank, step, epoch, time, metric, value FROM read_parquet("
            f"'{lake}/run=job/**/*.parquet', hive_partitioning = true) ORDER BY rank, step, metric"
        )
        .fetchall()
    )
    assert same(rows, expected())  # NaN and the infinities survive, as in the flat file
    with pytest.raises(ExportError, match=r"already holds run 'job': remove its run= folder"):
        lay_out_hive(tmp_path / "job.parquet", lake)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ExportError, match="it is a file"):
        lay_out_hive(tmp_path / "job.parquet", tmp_path / "afile")
