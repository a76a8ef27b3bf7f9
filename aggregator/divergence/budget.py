"""The false-alarm budget split between the CUSUM and the window test (docs/divergence.md).

The budget is ``DivergenceConfig.alarms_per_hour`` false alarms per run-hour on clean data, at
``budget_steps_per_hour`` steps with ``budget_metrics`` metrics scored. The CUSUM's limits are
set by their growth per doubling of the ranks (``grown_limit``); what they spend on clean data
is computed here from the CUSUM's in-control run length on z ~ N(0, 1), and the window test's
limit spends what is left. In a small world z has a heavier tail (``ztail``), so there the
CUSUM's limit is raised until it spends on that world's law what the normal model counts at
the grown limit (``small_world_limit``): the split holds at every world size. So the split
follows the CUSUM's limits instead of being set beside them: a steeper growth leaves the window
test more of the budget, at every world size, from one definition.

Pure: numbers in, numbers out; each limit's chain is solved once (cached).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache, partial
from typing import TYPE_CHECKING

import numpy as np
from rankwatch.aggregator.divergence import ztail
from rankwatch.aggregator.divergence.ztail import normal_tail

if TYPE_CHECKING:
    from rankwatch.aggregator.divergence.config import DivergenceConfig

CELLS = 800  # evidence grid of the CUSUM's Markov chain ...
SMALL_CELLS = 400  # ... on a small world's law (solved for many limits: 8x cheaper, ~1 % off)
CUSUM_SHARE_MAX = 0.5  # the window test keeps at least the other half, whatever the CUSUM spends
LIMIT_GRID = 0.01  # a small world's CUSUM limit is a point of this grid (rounded up) ...
MAX_RAISE = 3_200  # ... at most this many points above the grown limit
TINY_RATE = 1e-300  # a flag rate this small is no flag at all (and its log is finite)


Tail = Callable[[np.ndarray], np.ndarray]  # x -> P(z > x), the clean z's law


def _normal(x: np.ndarray) -> np.ndarray:
    return normal_tail(x)


@lru_cache(maxsize=256)
def cusum_flag_rate(limit: float, allowance: float, confirm_steps: int) -> float:
    """False flags per rank-step, both directions, of the CUSUM on N(0, 1) z-scores."""
    return _chain_rate(limit, allowance, confirm_steps, _normal)


@lru_cache(maxsize=1024)
def small_world_flag_rate(
    limit: float,
    allowance: float,
    confirm_steps: int,
    n: int,
    spread_pool: float,
    spread: float,
    error: float,
) -> float:
    """``cusum_flag_rate`` on the law of z in a world of ``n`` ranks (``ztail``), averaged over
    the pooled spread's relative error ``error``: a run spends many steps at one error, so it
    is the rate, not the law, that is averaged over it."""
    nodes, weights = ztail.NODES
    rate = 0.0
    for g, w in zip(nodes.tolist(), weights.tolist(), strict=True):
        law = partial(ztail.tail, n, spread_pool, spread, error * g)
        rate += w * _chain_rate(limit, allowance, confirm_steps, law, SMALL_CELLS)
    return rate


def _chain_rate(
    limit: float, allowance: float, confirm_steps: int, upper: Tail, cells: int = CELLS
) -> float:
    """The inverse of the CUSUM's in-control run length on z with ``P(z > x) = upper(x)``, from
    a Markov chain over the evidence (Brook & Evans 1972): evidence clipped to [0, limit), a
    step adding ``min(z - allowance, cap)`` with ``cap = limit / confirm_steps``; reaching the
    limit is a flag. High and low are two CUSUMs on a symmetric law: twice one's rate."""
    w = limit / cells
    cap = limit / confirm_steps
    top = cap + allowance  # a z above this adds exactly ``cap``
    # z landing in cell j from cell i depends on j - i alone: the CDF at 2 * cells points
    d = np.arange(-cells, cells + 1)
    edges = np.minimum((d - 0.5) * w + allowance, top)
    cdf_at = 1.0 - upper(edges)
    shift = np.arange(cells)[None, :] - np.arange(cells)[:, None] + cells  # index of j - i
    moves = cdf_at[shift + 1] - cdf_at[shift]
    moves[:, 0] = cdf_at[shift[:, 0] + 1]  # evidence below 0 is clipped to 0
    land = np.floor(((np.arange(cells) + 0.5) * w + cap) / w).astype(np.int64)
    inside = land < cells  # otherwise a capped step reaches the limit: a flag, out of the chain
    moves[np.arange(cells)[inside], land[inside]] += float(upper(np.array([top]))[0])
    run_length = np.linalg.solve(np.eye(cells) - moves, np.ones(cells))[0]
    return 2.0 / float(run_length)


@lru_cache(maxsize=256)
def small_world_limit(
    grown: float,
    allowance: float,
    confirm_steps: int,
    world_confirm_steps: int,
    n: int,
    spread_pool: float,
    spread: float,
    error: float,
) -> float:
    """The CUSUM limit of a world of ``n`` ranks scored on ``ztail``'s law: the smallest point
    of a ``LIMIT_GRID`` grid from ``grown`` up at which the CUSUM (confirming in
    ``world_confirm_steps``) flags a rank no more often than the normal model says it does at
    ``grown`` (confirming in ``confirm_steps``): what the budget counts it as spending
    (``cusum_alarms_per_hour``) is then what it spends."""
    budgeted = cusum_flag_rate(grown, allowance, confirm_steps)
    if not budgeted > TINY_RATE:  # an allowance so wide that nothing is ever flagged
        return grown
    target = math.log(budgeted)

    def log_rate(k: int) -> float:
        limit = grown + k * LIMIT_GRID
        rate = small_world_flag_rate(
            limit, allowance, world_confirm_steps, n, spread_pool, spread, error
        )
        return math.log(max(rate, TINY_RATE))

    if log_rate(0) <= target:
        return grown
    # the log of the rate falls nearly linearly with the limit (~4x per +0.5): a secant
    # step or two lands next to the answer, and the grid points around it settle it
    lo, lo_rate, hi = 0, log_rate(0), 50
    while (hi_rate := log_rate(hi)) > target:
        if hi >= MAX_RAISE:
            return round(grown + hi * LIMIT_GRID, 6)
        lo, lo_rate, hi = hi, hi_rate, 2 * hi
    for _ in range(2):
        if hi - lo <= 1:
            break
        k = lo + (hi - lo) * (lo_rate - target) / (lo_rate - hi_rate)
        k = min(max(math.ceil(k), lo + 1), hi - 1)
        if (k_rate := log_rate(k)) > target:
            lo, lo_rate = k, k_rate
            hi_rate = log_rate(hi)
        else:
            hi, hi_rate = k, k_rate
            if log_rate(k - 1) > target:
                lo, lo_rate = k - 1, log_rate(k - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if log_rate(mid) > target else (lo, mid)
    return round(grown + hi * LIMIT_GRID, 6)


def _rank_steps_per_hour(cfg: DivergenceConfig, n: int) -> float:
    return cfg.budget_steps_per_hour * max(n, 1) * cfg.budget_metrics


def cusum_alarms_per_hour(cfg: DivergenceConfig, n: int) -> float:
    """The CUSUM's false alarms per run-hour at ``n`` ranks: on the normal model at its grown
    limit, which is also what it spends in a small world, whose limit is raised until it does
    on that world's law of z (``small_world_limit``)."""
    rate = cusum_flag_rate(cfg.grown_limit(n), cfg.z_allowance, cfg.confirm_steps)
    return rate * _rank_steps_per_hour(cfg, n)


def window_alarms_per_hour(cfg: DivergenceConfig, n: int) -> float:
    """The window test's share: the budget less what the CUSUM spends at ``n`` ranks. A CUSUM
    that spends more than ``CUSUM_SHARE_MAX`` of it (its growth turned off in a big world, by
    choice) is charged that much, so the window test keeps a limit of its own."""
    budget = cfg.alarms_per_hour
    return budget - min(cusum_alarms_per_hour(cfg, n), CUSUM_SHARE_MAX * budget)


def window_alpha(cfg: DivergenceConfig, n: int) -> float:
    """The window test's false-flag probability per rank, step and direction at ``n`` ranks."""
    return window_alarms_per_hour(cfg, n) / (_rank_steps_per_hour(cfg, n) * 2)


__all__ = [
    "cusum_alarms_per_hour",
    "cusum_flag_rate",
    "small_world_flag_rate",
    "small_world_limit",
    "window_alarms_per_hour",
    "window_alpha",
]
