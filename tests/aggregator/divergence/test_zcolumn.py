"""``zcolumn`` against the one definition: ``z_step``'s dict, and Python's ``round``, on random
steps of every world size the detector scores differently (lists below 128 ranks, numpy from
there), with ties, gaps in the rank numbers, NaN and infinities; and the rounding on halfway
cases, huge and tiny values and negative zero."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rankwatch.aggregator.divergence.zcolumn import round_z, z_step_columns
from rankwatch.aggregator.divergence.zgrid import Z_DECIMALS, z_step


def same_floats(a: list[float], b: list[float]) -> bool:
    """Equal as floats go to JSON: NaN equal to NaN, -0.0 told from 0.0."""
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("world", [1, 2, 3, 8, 60, 127, 128, 129, 1000, 20_000])
@pytest.mark.parametrize("metric", ["loss", "grad_norm", "lr", "custom"])
def test_columns_are_z_step(world: int, metric: str) -> None:
    rng = np.random.default_rng(world)
    ranks = np.sort(rng.choice(world * 3, world, replace=False))  # gaps in the rank numbers
    values = 2.0 + 0.001 * rng.integers(-20, 21, world)  # a coarse grid: ties in value and z
    if world > 5:
        values[rng.choice(world, max(1, world // 20))] = np.nan
        values[rng.choice(world, 2)] = [np.inf, -np.inf]
        values[rng.choice(world, 1)] = 40.0  # one far off
    want = z_step(dict(zip(ranks.tolist(), values.tolist(), strict=True)), metric)
    got_ranks, got_z = z_step_columns(ranks, values, metric)
    assert got_ranks.tolist() == list(want)
    assert same_floats(got_z.tolist(), list(want.values()))
    if world > 5:
        assert np.isnan(got_z).any() and (np.abs(got_z[np.isfinite(got_z)]) > 3).any()


def test_no_ranks() -> None:
    ranks, z = z_step_columns(np.zeros(0, np.int64), np.zeros(0))
    assert ranks.size == 0 and z.size == 0 and z_step({}) == {}


def test_round_z_is_pythons_round() -> None:
    rng = np.random.default_rng(24)
    scale = 10**Z_DECIMALS
    halves = (np.arange(-4000, 4000) + 0.5) / scale  # decimal halfway cases, inexact in binary
    exact = np.arange(-64, 64) / 8  # binary halfway cases, exact: ties to even
    odd = [0.285, 1.005, 2.675, -2.675, 0.0, -0.0, -0.001, 5e-324, 1e-320, 4.5e13 + 0.125,
           7e15 + 0.5, 2.0**53, 1e300, -1e300, 1.7976931348623157e308]  # fmt: skip
    z = np.concatenate([rng.normal(0, 3, 200_000), rng.standard_cauchy(20_000), halves,
                        halves + 1e-15, exact, odd])  # fmt: skip
    got = round_z(z).tolist()
    assert same_floats(got, [round(v, Z_DECIMALS) for v in z.tolist()])
    assert np.isnan(round_z(np.array([np.nan, np.inf, -np.inf]))).all()
