"""The one robust z: its scale floors, and the heatmap grid scored by the detector."""

from __future__ import annotations

import math

import pytest
from rankwatch.aggregator.divergence.config import DivergenceConfig, MetricRule
from rankwatch.aggregator.divergence.robust import MAD_TO_SIGMA, robust_scale
from rankwatch.aggregator.divergence.zgrid import z_columns

CFG = DivergenceConfig()
LOSS, LR = CFG.rule("loss"), CFG.rule("lr")


@pytest.mark.parametrize(
    ("rule", "n", "median", "mad", "typical", "expected"),
    [
        (LOSS, 8, 2.0, 0.1, 0.0, MAD_TO_SIGMA * 0.1),  # the spread itself
        (LOSS, 8, 2.0, 0.0, 0.0, 0.01 * 2.0),  # ranks agree: 1 % of the median
        (LOSS, 8, 2.0, 0.001, 0.1, 1.075 * 0.1 * 2.0),  # the run's typical spread x c(8)
        (LOSS, 4, 2.0, 0.001, 0.1, 1.216 * 0.1 * 2.0),  # c(4): a MAD of 4 is biased low
        (LOSS, 8, 2.0, 0.2, 0.1, MAD_TO_SIGMA * 0.2),  # a noisier step than usual: its own
        # from 64 ranks a MAD within two of its own standard deviations of the pooled: pooled
        (LOSS, 64, 2.0, 0.15, 0.1, (1 + 0.6 / 64) * 0.1 * 2.0),
        # ... a step far noisier than usual: its own MAD, less two of its standard deviations
        (LOSS, 64, 2.0, 0.2, 0.1, MAD_TO_SIGMA * 0.2 / (1 + 2.4 / math.sqrt(64))),
        (LOSS, 1024, 2.0, 0.07, 0.1, (1 + 0.6 / 1024) * 0.1 * 2.0),  # large worlds: pooled
        (LOSS, 8, 0.0, 0.0, 0.0, CFG.abs_floor),  # a zero median
        (LOSS, 2, 2.0, 5.0, 0.03, 0.03 * 2.0),  # a pair: history only, never its own MAD
        (LR, 8, 1e-3, 0.0, 0.0, 1e-6 * 1e-3),  # the metric's own floor
    ],
)
def test_scale_floors(
    rule: MetricRule, n: int, median: float, mad: float, typical: float, expected: float
) -> None:
    assert robust_scale(CFG, rule, n, median, mad, typical) == pytest.approx(expected)


def test_grid_cells_missing_nonfinite_and_agreeing() -> None:
    grid = {0: [1.0, 1.0, None], 1: [1.1, 1.0, math.nan], 2: [0.9, 1.0, None], 3: [3.0, None, None]}
    z = z_columns(grid, 3, "loss")
    assert z[3][0] is not None and z[3][0] > 10 and all(abs(z[r][0]) < 3 for r in (0, 1, 2))
    assert [z[r][1] for r in (0, 1, 2)] == [0.0, 0.0, 0.0] and z[3][1] is None
    assert math.isnan(z[1][2]) and z[0][2] is None  # no finite value in the column at all


def test_grid_uses_the_metrics_rule() -> None:
    # lr must match exactly across ranks: 0.01 % off is far off for lr, nothing for a loss
    grid = {r: [1e-3] for r in range(8)} | {8: [1e-3 * 1.0001]}
    assert z_columns(grid, 1, "lr")[8][0] > 6
    assert z_columns(grid, 1, "loss")[8][0] < 0.1
