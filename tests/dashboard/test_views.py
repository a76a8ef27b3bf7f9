"""Pure helpers behind the routes: table-driven, no I/O."""

from __future__ import annotations

import math

import pytest
from rankwatch.dashboard import views


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, []),
        ("", []),
        ("3", [3]),
        ("0,3,8-11", [0, 3, 8, 9, 10, 11]),
        (" 5 , 2 ,5 ", [2, 5]),
        ("1-1", [1]),
        ("4,,6", [4, 6]),
    ],
)
def test_parse_ranks(text: str | None, expected: list[int]) -> None:
    assert views.parse_ranks(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a", "not a rank"),
        ("3-1", "not a valid rank range"),
        ("-2", "not a rank"),
        ("0-100000", "at most"),
        (str(views.MAX_RANK_ID + 1), "not a valid rank range"),
    ],
)
def test_parse_ranks_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        views.parse_ranks(text)


def test_order_metrics_puts_training_metrics_first() -> None:
    names = ["zeta", "throughput", "loss_aux", "lr", "loss", "grad_norm", "alpha", "step_time"]
    assert views.order_metrics(names) == [
        "loss",
        "loss_aux",
        "lr",
        "throughput",
        "step_time",
        "grad_norm",
        "alpha",
        "zeta",
    ]


def test_merge_runs_joins_store_and_live_state() -> None:
    stored = [
        {
            "run": "old",
            "world_size": 2,
            "ranks": 2,
            "first_time": 10.0,
            "last_time": 20.0,
            "records": 40,
        },
        {
            "run": "live",
            "world_size": 4,
            "ranks": 4,
            "first_time": 100.0,
            "last_time": 150.0,
            "records": 400,
        },
    ]
    snapshot = {
        "runs": [
            {
                "run": "live",
                "state": "running",
                "world_size": 4,
                "last_time": 160.0,
                "last_step": 77,
                "ranks": [{"rank": r} for r in range(4)],
                "divergences": [{"rank": 2}],
            },
            {
                "run": "new",
                "state": "running",
                "world_size": 8,
                "last_time": 170.0,
                "last_step": 1,
                "ranks": [{"rank": 0}],
                "divergences": [],
            },
        ]
    }
    rows = views.merge_runs(stored, snapshot)
    assert [r["run"] for r in rows] == ["new", "live", "old"]  # newest record first
    live = rows[1]
    assert live["state"] == "running"
    assert live["start"] == 100.0
    assert live["last_time"] == 160.0
    assert live["last_step"] == 77
    assert live["divergences"] == 1
    assert live["records"] == 400
    assert rows[2]["state"] == "history"
    assert rows[0]["start"] is None and rows[0]["ranks"] == 1


def test_outlier_ranks_from_divergences_flags_and_alerts() -> None:
    entry = {
        "divergences": [{"rank": 5, "metric": "loss"}, {"rank": 9, "metric": "lr"}],
        "ranks": [
            {"rank": 1, "divergent": ["loss"]},
            {"rank": 5, "divergent": ["loss"]},
            {"rank": 7, "divergent": []},
        ],
    }
    assert views.outlier_ranks(entry, "loss", [(3, "loss"), (4, "lr"), (None, "loss")]) == [
        5,
        1,
        3,
    ]
    assert views.outlier_ranks(None, "loss", []) == []


def test_robust_z_flags_the_odd_rank() -> None:
    grid = {0: [1.0, 1.0], 1: [1.1, 1.0], 2: [0.9, 1.0], 3: [3.0, None], 4: [1.05, math.nan]}
    z = views.robust_z_columns(grid, 2)
    assert z[3][0] is not None and z[3][0] > 10
    assert all(abs(z[r][0]) < 3 for r in (0, 1, 2, 4))
    # column 1: every finite rank agrees -> 0, not a division by zero
    assert [z[r][1] for r in (0, 1, 2)] == [0.0, 0.0, 0.0]
    assert z[3][1] is None  # no value, no cell
    assert math.isnan(z[4][1])  # a NaN is its own kind of cell


def test_bucket_series_puts_ranks_on_one_grid_and_keeps_nan() -> None:
    series = {
        0: {"step": [1, 2, 3, 4, 5, 6], "value": [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]},
        1: {"step": [1, 3, 5], "value": [1.0, math.nan, 5.0]},
    }
    steps, width, grid = views.bucket_series(series, 3)
    assert steps == [1, 3, 5]
    assert width == 2
    assert grid[0] == [1.0, 2.0, 3.0]
    assert grid[1][0] == 1.0 and math.isnan(grid[1][1]) and grid[1][2] == 5.0


def test_bucket_series_empty() -> None:
    assert views.bucket_series({}, 10) == ([], 1, {})
