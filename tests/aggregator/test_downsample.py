"""Min/max downsampling keeps spikes and non-finite markers, stays within budget, never samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rankwatch.aggregator.downsample import bucket_bounds, minmax, minmax_indices


def series(n: int, seed: int = 0) -> tuple[list[int], list[float]]:
    rng = np.random.default_rng(seed)
    return list(range(n)), (1.0 + 0.01 * rng.standard_normal(n)).tolist()


@pytest.mark.parametrize("spike_at", [0, 1, 4_999, 5_000, 9_998, 9_999])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_single_step_spike_survives(spike_at: int, sign: float) -> None:
    steps, values = series(10_000)
    values[spike_at] = 1.0 + sign * 50.0
    s, v = minmax(steps, values, 200)
    assert (spike_at, values[spike_at]) in zip(s, v, strict=True)


@pytest.mark.parametrize("n", [0, 1, 2, 199, 200, 201, 1_000, 12_345])
@pytest.mark.parametrize("max_points", [2, 3, 10, 200])
def test_output_within_budget_monotone_and_from_the_input(n: int, max_points: int) -> None:
    steps, values = series(n)
    s, v = minmax(steps, values, max_points)
    assert len(s) == len(v) <= max(n if n <= max_points else max_points, 0)
    assert s == sorted(s) and len(set(s)) == len(s)
    lookup = dict(zip(steps, values, strict=True))
    assert all(lookup[a] == b for a, b in zip(s, v, strict=True))  # never invented
    if n <= max_points:
        assert (s, v) == (steps, values)


def test_every_bucket_keeps_its_min_and_max() -> None:
    steps = list(range(0, 1_000, 10))  # gaps in steps do not matter: buckets are by position
    values = [float((i * 37) % 101) for i in range(100)]
    s, v = minmax(steps, values, 20)  # 10 buckets of 10 points
    for b in range(10):
        chunk = values[10 * b : 10 * b + 10]
        kept = [val for st, val in zip(s, v, strict=True) if 100 * b <= st < 100 * b + 100]
        assert min(chunk) in kept and max(chunk) in kept


def test_all_equal_input() -> None:
    s, v = minmax(list(range(1_000)), [2.5] * 1_000, 50)
    assert 1 <= len(s) <= 50 and set(v) == {2.5}


@pytest.mark.parametrize("marker", [math.nan, math.inf, -math.inf])
def test_nonfinite_points_are_always_kept(marker: float) -> None:
    steps, values = series(10_000)
    for i in (17, 4_321, 4_322, 9_000):
        values[i] = marker
    s, v = minmax(steps, values, 100)
    kept = {st for st, val in zip(s, v, strict=True) if not math.isfinite(val)}
    assert kept == {17, 4_321, 4_322, 9_000}
    assert len(s) <= 100


def test_a_long_run_of_nan_keeps_its_ends_and_the_finite_part_its_spikes() -> None:
    steps, values = series(10_000)
    values[6_000:] = [math.nan] * 4_000  # the run diverged at step 6000
    values[3_000] = 99.0
    s, v = minmax(steps, values, 100)
    nan_steps = [st for st, val in zip(s, v, strict=True) if math.isnan(val)]
    assert nan_steps == [6_000, 9_999]
    assert (3_000, 99.0) in zip(s, v, strict=True) and len(s) <= 100


def test_too_many_markers_are_thinned_to_half_the_budget() -> None:
    steps, values = series(10_000)
    values[::2] = [math.nan] * 5_000  # alternating: 5000 separate runs
    s, v = minmax(steps, values, 100)
    markers = [st for st, val in zip(s, v, strict=True) if math.isnan(val)]
    assert markers[0] == 0 and len(markers) <= 50 and len(s) <= 100


def test_indices_pick_other_columns() -> None:
    values = [0.0] * 100
    values[42] = 5.0
    idx = minmax_indices(values, 10)
    assert 42 in idx.tolist() and len(idx) <= 10 and list(idx) == sorted(idx)


@pytest.mark.parametrize(("n", "buckets"), [(10, 3), (3, 10), (0, 4), (100, 100)])
def test_bucket_bounds_cover_everything(n: int, buckets: int) -> None:
    b = bucket_bounds(n, buckets).tolist()
    assert b[0] == 0 and b[-1] == n and b == sorted(b)


@pytest.mark.parametrize(
    ("steps", "values", "max_points", "match"),
    [
        ([1, 2], [1.0], 10, "2 steps but 1 values"),
        ([2, 1, 3], [1.0, 2.0, 3.0], 2, "increasing"),
        ([1, 2, 3], [1.0, 2.0, 3.0], 1, "max_points"),
    ],
)
def test_bad_input_is_explained(
    steps: list[int], values: list[float], max_points: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        minmax(steps, values, max_points)
