"""The tail of a rank's robust z in a small world: the law the limits are derived on there.

The CUSUM's and the window test's limits are read off a model of the clean z. z ~ N(0, 1) is
that model in a big world, but not in a small one, where a rank's z has a heavier tail for
three reasons, all in ``robust.robust_scale``:

* the median it is measured from is itself noisy (the median of 8 values moves by ~0.4 sigma
  from step to step), and a rank far out is never the one that pulls it along;
* the scale is the larger of the pooled spread and the step's own ``1.4826 * MAD``, the latter
  also a function of the other ranks of the step;
* the pooled spread is an estimate (relative standard deviation ``scale_error``) that moves
  slowly, so a run spends many steps at a scale a few percent small.

``c(n)`` makes the standard deviation of z about 1, but the standard deviation is set by the
ranks near the median, and a false alarm by the ranks far from it: at 8 ranks P(z > 4) is
several times the normal's (docs/divergence.md). So, below ``SLACK_RANKS`` (where the step's
own MAD floor keeps its full weight; the detector uses it from ``small_n`` ranks on), the
limits are derived on the law of z itself: for a rank
above the others (the only place a flag can come from), the median and the MAD of the step
are those of the other ``n - 1`` ranks with this one at the top, so given them and the pooled
spread, ``P(z > t) = P(x > median + t * scale)`` is a normal tail. It is averaged over the other
ranks by a seeded sample of them (``SAMPLES`` worlds: the same numbers on every call), and the
pooled spread's error is kept apart, as Gauss-Hermite nodes (``NODES``) the caller averages a
rate over: it moves more slowly than a flag takes to confirm.

Below the allowances (|z| < ~1) a rank is not above the others' median and the law is only
approximate; a flag is decided in the tail, where it is exact up to the sampling.

Pure: numbers in, numbers out; one world size's law is computed once (cached).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from rankwatch.aggregator.divergence.robust import MAD_TO_SIGMA, SLACK_RANKS, small_sample_factor

SAMPLES = 16_000  # sampled worlds of the other ranks (the tail's sampling error: ~1.5 %)
MEAN_SAMPLES = 100_000  # sampled whole worlds for the mean MAD the pooled spread estimates
SEED = 24  # the sample is fixed: a limit never depends on the call
T_LO, T_HI, T_STEP = -6.0, 7.0, 0.08  # the grid the tail is kept on, in z units (log P(z > t)
# curves by ~1 per unit squared: interpolated linearly, 0.08 is 0.1 % off)
MIN_RANKS = 3  # a pair is scored against its own history, not by a median and a MAD


def _gauss_hermite(k: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite_e.hermegauss(k)
    return x, w / w.sum()


NODES = _gauss_hermite(9)  # the pooled spread's relative error, in its standard deviations


def applies(n: int) -> bool:
    """Whether a world of ``n`` ranks is derived on this law (else on z ~ N(0, 1))."""
    return MIN_RANKS <= n < SLACK_RANKS


def scale_error(spread_alpha: float, n: int) -> float:
    """The relative standard deviation of the pooled spread: an EWMA (weight ``spread_alpha``)
    of ``1.4826 * MAD``, whose relative standard deviation is about 1.2 / sqrt(n) for normal
    ranks (1.17-1.24 from 8 ranks on, simulated)."""
    a = spread_alpha
    return 1.2 / math.sqrt(max(n, 1)) * math.sqrt(a / (2 - a))


def normal_tail(x: np.ndarray) -> np.ndarray:
    """P(N(0, 1) > x), to a relative error below 1.2e-7 (Numerical Recipes' ``erfcc``): numpy
    has no erfc, and a tail this far out needs its relative precision."""
    y = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * y)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))  # fmt: skip
    upper = 0.5 * t * np.exp(-y * y + poly)
    return np.where(x >= 0, upper, 1.0 - upper)


@lru_cache(maxsize=64)
def _others(n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(median, 1.4826 * MAD) of each sampled step with the rank scored at the top, in units
    of the ranks' sigma, and the mean of ``1.4826 * MAD`` over whole steps (what the pooled
    spread estimates; from ``MEAN_SAMPLES`` steps: a 1 % error in it is a 15 % error in the
    tail at z = 4)."""
    rng = np.random.default_rng([SEED, n])
    others = rng.standard_normal((SAMPLES, n - 1))
    top = np.concatenate([others, np.full((SAMPLES, 1), np.inf)], axis=1)
    median = np.median(top, axis=1)
    mad = MAD_TO_SIGMA * np.median(np.abs(top - median[:, None]), axis=1)
    whole = rng.standard_normal((MEAN_SAMPLES, n))
    whole_mad = np.median(np.abs(whole - np.median(whole, axis=1)[:, None]), axis=1)
    return median, mad, float(MAD_TO_SIGMA * whole_mad.mean())


def _grid() -> np.ndarray:
    # coarse where z removes evidence (the law is approximate there anyway), fine in the tail
    return np.concatenate([np.arange(T_LO, 0.0, 0.25), np.arange(0.0, T_HI + T_STEP / 2, T_STEP)])


@lru_cache(maxsize=512)
def log_tail(n: int, spread_pool: float, spread: float, deviation: float) -> np.ndarray:
    """log P(z > t) on ``_grid()`` of a rank in a world of ``n`` ranks whose values spread by
    ``spread`` of their median (relative standard deviation), the pooled spread ``1 +
    deviation`` times what it estimates.

    The pooled scale is a relative spread times the step's ``|median|``, so it moves with the
    median: a rank is ``t`` scales out when ``x > m + t * max(mad, pooled * (1 + spread * m))``,
    ``m`` being the median's offset (all in the ranks' sigma). The wider the ranks' relative
    spread, the more the median's noise counts, and the heavier the tail."""
    median, mad, mean_mad = _others(n)
    pooled = spread_pool * small_sample_factor(n) * mean_mad * max(1.0 + deviation, 0.5)
    scale = np.maximum(mad, pooled * np.maximum(1.0 + spread * median, 0.0))
    t = _grid()
    tails = normal_tail(median[None, :] + t[:, None] * scale[None, :]).mean(axis=1)
    return np.log(np.maximum(tails, 1e-300))


def tail(n: int, spread_pool: float, spread: float, deviation: float, x: np.ndarray) -> np.ndarray:
    """P(z > x) for each x (interpolated on the grid: log P is smooth there)."""
    logs = log_tail(n, spread_pool, spread, deviation)
    return np.exp(np.interp(x, _GRID, logs, left=0.0, right=-np.inf))


_GRID = _grid()


__all__ = ["NODES", "applies", "normal_tail", "scale_error", "tail"]
