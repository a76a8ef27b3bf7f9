"""Run comparison, pure: the job of a derived run name, the previous run of a job, and the
medians of two bands at their common steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rankwatch.aggregator.compare import compare_medians, job_stems, previous_run


@pytest.mark.parametrize(
    ("run", "stems"),
    [
        ("train-1129-2130-3fa2", ["train"]),  # stamp form: unambiguous
        ("my-train-1129-2130-3fa2", ["my-train"]),
        ("run-2024-1129-2130-3fa2", ["run-2024"]),
        ("train-launch-3fa2", ["train"]),
        ("train-12345-3fa2", ["train"]),  # a job id in place of the stamp
        # names derived before the stamp lost its year
        ("train-20261129-2130-3fa2c1", ["train"]),
        ("my-train-20261129-2130-3fa2c1", ["my-train"]),
        ("train-launch-3fa2c1", ["train"]),
        ("demo-20261201-205000", ["demo"]),
        # job id form: the id may hold dashes, and so may the stem
        ("torch_ddp-1c8e35d8-513-63bf3e", ["torch_ddp-1c8e35d8", "torch_ddp"]),
        ("gpt", []),  # named by hand
        ("gpt-final", []),
    ],
)
def test_job_stems(run: str, stems: list[str]) -> None:
    assert job_stems(run) == stems


def test_the_previous_run_is_the_latest_earlier_one_of_the_same_job() -> None:
    stored = [
        {"run": "train-20261129-2130-aaaaaa", "first_time": 1.0},
        {"run": "train-20261130-2130-bbbbbb", "first_time": 2.0},
        {"run": "eval-20261130-2200-cccccc", "first_time": 2.5},
        {"run": "train-20261201-2130-dddddd", "first_time": 3.0},
        {"run": "train-20261202-2130-eeeeee", "first_time": 4.0},  # later: not a reference
    ]
    assert previous_run("train-20261201-2130-dddddd", stored) == (
        "train-20261130-2130-bbbbbb", "train",
    )  # fmt: skip
    assert previous_run("train-20261129-2130-aaaaaa", stored) is None  # the first of its job
    assert previous_run("eval-20261130-2200-cccccc", stored) is None
    assert previous_run("gpt", [*stored, {"run": "gpt2", "first_time": 0.0}]) is None
    later = [*stored, {"run": "train-1203-0900-ab12", "first_time": 5.0}]
    assert previous_run("train-1203-0900-ab12", later) == ("train-20261202-2130-eeeeee", "train")


def band(steps: list[int], medians: list[float]) -> dict[str, np.ndarray]:
    return {"step": np.array(steps, dtype=np.int64), "median": np.array(medians)}


def test_medians_at_the_last_and_evenly_spaced_common_steps() -> None:
    mine = band(list(range(0, 101, 10)), [1.0 / (1 + s) for s in range(0, 101, 10)])
    ref = band(list(range(0, 81, 5)), [2.0 / (1 + s) for s in range(0, 81, 5)])
    out = compare_medians(mine, ref)
    assert out["common_steps"] == 9  # 0, 10, ..., 80
    assert out["last"]["step"] == 80
    assert out["last"]["ratio"] == pytest.approx(0.5)
    assert [p["step"] for p in out["points"]] == [0, 30, 50]
    assert all(p["ratio"] == pytest.approx(0.5) for p in out["points"])


def test_no_common_step_and_a_zero_reference() -> None:
    out = compare_medians(band([1, 2], [1.0, 2.0]), band([3, 4], [1.0, 1.0]))
    assert out["common_steps"] == 0 and out["last"] is None and out["points"] == []
    assert (out["run_last_step"], out["ref_last_step"]) == (2, 4)
    zero = compare_medians(band([1, 2], [1.0, math.nan]), band([1, 2], [0.0, 1.0]))
    assert zero["common_steps"] == 1  # a NaN median is no common step
    assert zero["last"] == {"step": 1, "run": 1.0, "ref": 0.0, "ratio": None}
