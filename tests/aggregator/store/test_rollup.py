"""Rollup levels against a brute-force numpy computation, on a real DuckDB file."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pytest
from rankwatch.aggregator.store import columns, rollup
from rankwatch.aggregator.store.columns import SeriesColumns


def _fold_batches(con: duckdb.DuckDBPyConnection, batches: list[dict[str, np.ndarray]]) -> None:
    for batch in batches:
        con.register("src", batch)
        con.execute("BEGIN TRANSACTION")
        # numpy NaN reaches DuckDB as NULL; the store restores it the same way
        rest = rollup.fold(
            con,
            "series",
            rollup.raw_part(
                "SELECT 'r' AS run, 'loss' AS metric, key, step, coalesce(value, 'nan'::DOUBLE) "
                "AS value FROM src"
            ),
        )
        rollup.run_script(con, [*rest, "COMMIT"])
        con.unregister("src")


def _expected(keys: np.ndarray, steps: np.ndarray, values: np.ndarray, width: int) -> dict:
    out = {}
    for k, b in sorted({(int(k), int(s) // width) for k, s in zip(keys, steps, strict=True)}):
        sel = (keys == k) & (steps // width == b)
        v = values[sel]
        out[(k, b)] = (int(sel.sum()), float(np.min(v)), float(np.max(v)), float(np.sum(v)))
    return out


def _read_level(con: duckdb.DuckDBPyConnection, level: int) -> dict:
    rows = con.execute(
        rollup.bucket_sql("series", level, "run = $run AND metric = $metric", -(2**40), 2**40),
        {"run": "r", "metric": "loss"},
    ).fetchall()
    out = {(k, b): (n, mn, mx, s) for k, b, n, s, mn, _, mx, _, _, _ in rows}
    assert len(out) == len(rows), "a bucket was returned twice"
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_level_matches_brute_force_with_late_rows(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ranks, steps = 3, 9000
    keys = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    value = rng.normal(size=len(step))
    # Deliver in step order in uneven flushes, holding some rows back to arrive late.
    order = np.argsort(step, kind="stable")
    late = rng.random(len(order)) < 0.01
    on_time, held = order[~late], order[late]
    cuts = np.sort(rng.choice(len(on_time), size=40, replace=False))
    batches = [
        {"key": keys[i].astype(np.int32), "step": step[i], "value": value[i]}
        for i in np.split(on_time, cuts)
    ]
    batches.append({"key": keys[held].astype(np.int32), "step": step[held], "value": value[held]})
    con = duckdb.connect(str(tmp_path / "r.duckdb"))
    rollup.create_tables(con)
    _fold_batches(con, batches)
    for level, width in enumerate(rollup.LEVELS):
        got, want = _read_level(con, level), _expected(keys, step, value, width)
        assert got.keys() == want.keys()
        for key, (n, mn, mx, s) in want.items():
            assert got[key][:3] == (n, mn, mx)
            assert got[key][3] == pytest.approx(s)


def test_nan_and_inf_survive_every_level(tmp_path: Path) -> None:
    step = np.arange(10_000)
    value = np.ones(len(step))
    value[5000], value[7000], value[9000] = math.nan, math.inf, -math.inf
    con = duckdb.connect(str(tmp_path / "r.duckdb"))
    rollup.create_tables(con)
    _fold_batches(con, [{"key": np.zeros(len(step), np.int32), "step": step, "value": value}])
    for level, width in enumerate(rollup.LEVELS):
        rows = _read_level(con, level)
        assert math.isnan(rows[(0, 5000 // width)][2])  # NaN is the bucket's maximum
        assert rows[(0, 9000 // width)][1] == -math.inf
        if width < 2000:  # a coarser bucket also holds the NaN, which outranks +inf
            assert rows[(0, 7000 // width)][2] == math.inf


@pytest.mark.parametrize(
    ("rows_per_key", "span", "max_points", "keys", "level"),
    [
        (1000, 1000, 2000, 1024, -1),  # fits raw
        (100_000, 100_000, 2000, 1024, 1),  # 391 buckets of 256 -> 782 points
        (10_000, 10_000, 2000, 1024, 0),  # 627 buckets of 16
        (5000, 5000, 2000, 1024, 0),
        (100_000, 100_000, 2000, 1, 0),  # one rank: level 16 read, then reduced
        (10_000, 10_000, 2000, 1, -1),  # one rank: raw read, then reduced
        (10**7, 10**7, 2000, 1024, 2),  # beyond the coarsest level: reduced afterwards
        (90, 100_000, 100, 1024, -1),  # sparse logging: raw points fit
        (200, 100_000, 100, 1024, 2),  # 26 buckets of 4096
    ],
)
def test_choose_level(rows_per_key: int, span: int, max_points: int, keys: int, level: int) -> None:
    assert rollup.choose_level(rows_per_key, span, max_points, 2, keys) == level


@pytest.mark.parametrize(
    ("rows_per_key", "keys", "all_keys", "level"),
    [
        (3000, 3, 4096, 0),  # 3 outliers of 4,096 ranks: 12 M raw rows to scan; level 16 instead
        (3000, 3, 8, -1),  # a small run: the raw rows are cheap to find
        (900, 1, 4096, -1),  # one rank zoomed to 900 steps: 3.7 M rows scanned, raw kept
        (3000, 4096, 4096, 0),  # every rank asked for: nothing scanned in vain (as before)
        (200_000, 3, 4096, 1),  # level 256 (3.2 M rows scanned), not level 16 (51 M)
    ],
)
def test_choose_level_for_a_few_ranks_of_many_avoids_scanning_them_all(
    rows_per_key: int, keys: int, all_keys: int, level: int
) -> None:
    assert rollup.choose_level(rows_per_key, rows_per_key, 2000, 2, keys, all_keys) == level


def test_bucket_points_orders_min_and_max_and_drops_out_of_range() -> None:
    out = columns.bucket_columns(
        key=np.array([0, 0, 1]),
        mn=np.array([1.0, 2.0, 5.0]),
        mn_step=np.array([3, 20, 7]),
        mx=np.array([9.0, 2.0, 6.0]),
        mx_step=np.array([1, 20, 40]),
        start=0,
        end=30,
    ).to_lists()
    assert out[0] == {
        "step": [1, 3, 20],
        "value": [9.0, 1.0, 2.0],
        "min": [1.0, 1.0, 2.0],
        "max": [9.0, 9.0, 2.0],
    }
    assert out[1]["step"] == [7]  # its maximum lies outside [0, 30]


def test_minmax_reduce_keeps_spikes_and_budget() -> None:
    step = list(range(10_000))
    value = [0.0] * 10_000
    value[1234], value[8765] = 50.0, -50.0
    keys = np.zeros(len(step), np.int64)
    one_key = SeriesColumns.from_rows(keys, np.array(step), np.array(value))
    out = columns.minmax_reduce(one_key, 100).to_lists()[0]
    assert len(out["step"]) <= 100
    assert 50.0 in out["value"] and -50.0 in out["value"]
    assert out["step"] == sorted(out["step"])
    assert out["step"][out["value"].index(50.0)] == 1234


def test_band_reduce_envelope() -> None:
    n = 1000
    band = {
        "step": list(range(n)),
        "median": [1.0] * n,
        "p5": [0.5] * n,
        "p95": [1.5] * n,
        "min": [0.0] * n,
        "max": [2.0] * n,
    }
    band["max"][500] = 99.0
    band["median"][10] = math.nan
    out = columns.band_lists(columns.band_reduce({k: np.asarray(v) for k, v in band.items()}, 50))
    assert len(out["step"]) == 50
    assert max(out["max"]) == 99.0
    assert out["median"] == [1.0] * 50  # the NaN is ignored, not propagated
    assert out["step"][:2] == [0, 20]


@pytest.mark.parametrize(
    ("key", "b"),
    [
        ([0, 1, 0, 1], [1, 1, 2, 2]),  # per flush, every key: the stored order
        ([0, 0, 0, 1, 1, 1], [3, 1, 2, 3, 1, 2]),  # a scan that handed row groups over rotated
        ([5, 5, 5], [1, 2, 3]),  # already sorted: returned as is
        ([2**40, -(2**40), 0], [2**40, 5, -7]),  # too wide for one int64 key: lexsort
        ([], []),
    ],
)
def test_sort_buckets_orders_by_key_then_column(key: list[int], b: list[int]) -> None:
    res = {"key": np.array(key, dtype=np.int64), "mn_step": np.array(b, dtype=np.int64)}
    res["tag"] = np.arange(len(key))
    out = rollup.sort_buckets(res, "mn_step")
    assert list(zip(out["key"].tolist(), out["mn_step"].tolist(), strict=True)) == sorted(
        zip(key, b, strict=True)
    )
    assert [(key[t], b[t]) for t in out["tag"].tolist()] == sorted(zip(key, b, strict=True))
