"""The law of a small world's z (ztail) and the CUSUM limits derived on it (budget.py).

Pure, seeded, no sockets.
"""

from __future__ import annotations

import numpy as np
import pytest
from rankwatch.aggregator.divergence import ztail
from rankwatch.aggregator.divergence.budget import (
    LIMIT_GRID,
    cusum_flag_rate,
    small_world_flag_rate,
)
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector

CFG = DivergenceConfig()


def law_tail(n: int, x: np.ndarray, spread: float) -> np.ndarray:
    """P(z > x) on the law, averaged over the pooled spread's error as a run sees it."""
    error = ztail.scale_error(CFG.spread_alpha, n)
    nodes, weights = ztail.NODES
    return sum(
        w * ztail.tail(n, CFG.spread_pool, spread, error * g, x)
        for g, w in zip(nodes.tolist(), weights.tolist(), strict=True)
    )


def detector_z(n: int, spread: float, steps: int, seed: int) -> np.ndarray:
    """Every rank's z, as the detector scores it, over a clean run of ``steps`` steps whose
    ranks spread by ``spread`` of their median."""
    rng = np.random.default_rng(seed)
    det = DivergenceDetector(CFG)
    ranks = np.arange(n, dtype=np.int64)
    out = []
    for step in range(steps):
        values = 3.0 * (1 + spread * rng.standard_normal(n))
        res = det.update_array("r", "loss", step, ranks, values, n)
        if step >= 50:  # the pooled spread has forgotten where it started
            out.append(np.asarray(res.scores.z))
    return np.concatenate(out)


@pytest.mark.parametrize("spread", [0.05, 0.10])
def test_the_law_is_the_tail_of_the_detectors_own_z_at_8_ranks(spread: float) -> None:
    z = detector_z(8, spread, 16_000, seed=int(spread * 100))
    x = np.array([3.0, 3.5])
    seen = np.array([(np.abs(z) > t).mean() / 2 for t in x])  # both tails: one law
    law = law_tail(8, x, spread)
    normal = ztail.normal_tail(x)
    # ~500 and ~150 of 2 x 128,000 rank-steps past them: +-4.5 % and +-8 % (1 sigma)
    assert seen == pytest.approx(law, rel=0.3)
    # the normal model, on which the limits were read before, is lighter, and more so
    # further out, where a flag is decided
    assert (seen > np.array([1.2, 1.6]) * normal).all()
    # and a wider spread of the ranks makes it heavier still: the scale moves with the median
    assert (law_tail(8, x, 2 * spread) > law).all()


def test_the_normal_tail_has_its_relative_precision_far_out() -> None:
    import math

    x = np.array([-2.0, 0.0, 1.0, 3.0, 5.0, 8.0])
    exact = np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in x.tolist()])
    assert ztail.normal_tail(x) == pytest.approx(exact, rel=2e-7)


def test_a_small_worlds_limit_holds_the_rate_the_budget_counts_at_the_grown_limit() -> None:
    n, k = 8, CFG.z_allowance
    grown, limit = CFG.grown_limit(n), CFG.limit_for(n)
    assert limit > grown  # at 4.50, the CUSUM would spend several times what is counted
    error = ztail.scale_error(CFG.spread_alpha, n)

    def rate(at: float) -> float:
        return small_world_flag_rate(at, k, CFG.confirm_steps, n, CFG.spread_pool,
                                     CFG.budget_spread, error)  # fmt: skip

    budgeted = cusum_flag_rate(grown, k, CFG.confirm_steps)
    assert rate(grown) > 2 * budgeted
    # the smallest point of the grid that holds it: derived, not set
    assert rate(limit) <= budgeted < rate(limit - LIMIT_GRID)


def test_worlds_below_8_ranks_and_from_64_keep_the_grown_limits() -> None:
    for n in (2, 3, 4, 7, 64, 1_024, 4_096):
        assert CFG.limit_for(n) == CFG.grown_limit(n)
    assert not ztail.applies(2) and ztail.applies(3) and not ztail.applies(64)
    # the law is derived at any size it applies to: a three-step confirmation (below 8 ranks)
    # needs less than a two-step one, as one far-out step counts for less
    k, error = CFG.z_allowance, ztail.scale_error(CFG.spread_alpha, 4)
    args = (4, CFG.spread_pool, CFG.budget_spread, error)
    assert small_world_flag_rate(5.0, k, 3, *args) < small_world_flag_rate(5.0, k, 2, *args)


def test_without_the_spread_coupling_a_small_world_needs_less() -> None:
    tight = DivergenceConfig(budget_spread=0.0)
    assert CFG.grown_limit(8) < tight.limit_for(8) < CFG.limit_for(8)
