"""Chart points as numpy columns: table-driven; several keys at once give what each key alone
gives."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rankwatch.aggregator.store import columns
from rankwatch.aggregator.store.columns import SeriesColumns

NAN, INF = math.nan, math.inf


def as_lists(cols: SeriesColumns) -> dict[int, dict[str, list]]:
    return cols.to_lists()


def test_from_rows_splits_by_key_and_shares_raw_values() -> None:
    cols = SeriesColumns.from_rows(
        np.array([2, 2, 5, 9, 9, 9]), np.array([1, 2, 1, 4, 5, 6]), np.arange(6.0)
    )
    assert cols.keys.tolist() == [2, 5, 9]
    assert cols.offsets.tolist() == [0, 2, 3, 6]
    assert cols.points == 6 and len(cols) == 3
    assert cols.low is cols.value and cols.high is cols.value  # raw rows: min = max = value
    assert as_lists(cols) == {
        2: {"step": [1, 2], "value": [0.0, 1.0], "min": [0.0, 1.0], "max": [0.0, 1.0]},
        5: {"step": [1], "value": [2.0], "min": [2.0], "max": [2.0]},
        9: {"step": [4, 5, 6], "value": [3.0, 4.0, 5.0], "min": [3.0, 4.0, 5.0],
            "max": [3.0, 4.0, 5.0]},
    }  # fmt: skip


def test_empty() -> None:
    empty = SeriesColumns.from_rows(np.zeros(0, np.int32), np.zeros(0), np.zeros(0))
    assert len(empty) == 0 and empty.points == 0 and empty.to_lists() == {}
    assert columns.bucket_columns(*(np.zeros(0),) * 5, 0, 10).to_lists() == {}
    assert columns.minmax_reduce(empty, 10).to_lists() == {}


def test_masked_values_are_nan() -> None:
    value = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    cols = SeriesColumns.from_rows(np.array([0, 0]), np.array([1, 2]), value)
    assert cols.value[0] == 1.0 and math.isnan(cols.value[1])


@pytest.mark.parametrize(
    ("start", "end", "want"),
    [
        # key 0: buckets (min 1.0 @3, max 9.0 @1), (2.0 @20 only); key 1: (5.0 @7, 6.0 @40)
        (0, 50, {0: ([1, 3, 20], [9.0, 1.0, 2.0]), 1: ([7, 40], [5.0, 6.0])}),
        (0, 30, {0: ([1, 3, 20], [9.0, 1.0, 2.0]), 1: ([7], [5.0])}),
        (2, 30, {0: ([3, 20], [1.0, 2.0]), 1: ([7], [5.0])}),
        (21, 39, {}),  # every extreme outside the window: no key at all
        (8, 45, {0: ([20], [2.0]), 1: ([40], [6.0])}),
    ],
)
def test_bucket_columns_matches_the_list_form(
    start: int, end: int, want: dict[int, tuple[list[int], list[float]]]
) -> None:
    args = (
        np.array([0, 0, 1]),
        np.array([1.0, 2.0, 5.0]),
        np.array([3, 20, 7]),
        np.array([9.0, 2.0, 6.0]),
        np.array([1, 20, 40]),
    )
    cols = columns.bucket_columns(*args, start, end)
    got = {k: (p["step"], p["value"]) for k, p in cols.to_lists().items()}
    assert got == want
    for k, points in cols.to_lists().items():  # several keys at once: each as if alone
        alone = [a[args[0] == k] for a in args]
        assert columns.bucket_columns(*alone, start, end).to_lists() == {k: points}
    for p in cols.to_lists().values():  # every point lies within its bucket's extremes
        assert all(lo <= v <= hi for v, lo, hi in zip(p["value"], p["min"], p["max"], strict=True))


def test_minmax_reduce_touches_only_keys_over_budget() -> None:
    n = 1000
    key = np.repeat([0, 1, 2], [n, 5, n])
    step = np.r_[np.arange(n), np.arange(5), np.arange(n)]
    value = np.r_[np.zeros(n), np.arange(5.0), np.ones(n)]
    value[123], value[2 * n + 5 - 1] = 50.0, NAN  # a spike in key 0, a NaN last in key 2
    cols = columns.minmax_reduce(SeriesColumns.from_rows(key, step, value), 100)
    out = cols.to_lists()
    assert sorted(out) == [0, 1, 2]
    assert out[1]["step"] == [0, 1, 2, 3, 4]  # under budget: untouched
    for k in (0, 2):
        assert 0 < len(out[k]["step"]) <= 100
        assert out[k]["step"] == sorted(out[k]["step"])
    assert out[0]["step"][out[0]["value"].index(50.0)] == 123
    assert math.isnan(out[2]["value"][-1])
    # same as each key reduced alone
    for k in (0, 2):
        rows = key == k
        alone = SeriesColumns.from_rows(key[rows], step[rows], value[rows])
        ref = columns.minmax_reduce(alone, 100).to_lists()[k]
        np.testing.assert_array_equal(out[k]["step"], ref["step"])
        np.testing.assert_array_equal(out[k]["value"], ref["value"])
        np.testing.assert_array_equal(out[k]["min"], ref["min"])


@pytest.mark.parametrize(
    ("median", "want_median"),
    [
        ([1.0, 3.0, 5.0, 7.0], [2.0, 6.0]),
        ([NAN, 3.0, NAN, NAN], [3.0, NAN]),  # NaN ignored; no finite value stays NaN
    ],
)
def test_band_reduce(median: list[float], want_median: list[float]) -> None:
    band = {
        "step": np.array([0, 1, 2, 3]),
        "median": np.array(median),
        "p5": np.array([0.0, -1.0, 0.0, 0.0]),
        "p95": np.array([2.0, 2.0, 9.0, 2.0]),
        "min": np.array([-5.0, 0.0, 0.0, -INF]),
        "max": np.array([5.0, 5.0, 5.0, 5.0]),
    }
    out = columns.band_lists(columns.band_reduce(band, 2))
    assert out["step"] == [0, 2]
    np.testing.assert_array_equal(out["median"], want_median)
    assert out["p5"] == [-1.0, 0.0] and out["p95"] == [2.0, 9.0]
    assert out["min"] == [-5.0, -INF] and out["max"] == [5.0, 5.0]
    assert columns.band_reduce(band, 4) is band  # within budget: as is
