"""``divergence.zgrid.z_step`` as columns: the detector's z of one step of many ranks (a stored
run's latest values, 100,000 of them for the rank table), read from arrays and rounded with
numpy, with no dict or float object per rank on the way in or out.

The z is the detector's own (``DivergenceDetector.update_array``, which scores the arrays as
they are), with its window-sum test off: a step's z is scored before any test reads it, and the
first window test of a world size calibrates its limit, which costs more than the z of 100,000
ranks. The rounding is Python's ``round(z, Z_DECIMALS)``. The tests check both against
``z_step``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.divergence.types import RankScores, z_map
from rankwatch.aggregator.divergence.zgrid import Z_DECIMALS

__all__ = ["round_z", "z_step_columns"]

_SCALE = 10.0**Z_DECIMALS
# Past this |z * _SCALE|, rint and the division back are no longer exact: Python rounds those.
_EXACT_BELOW = 2.0**51
# z * _SCALE is off the exact product by at most half an ulp (1.1e-16 relative); this much
# from a halfway point, the product may have crossed it and Python decides.
_HALFWAY_SLACK = 1e-12


def round_z(z: np.ndarray) -> np.ndarray:
    """``round(v, Z_DECIMALS)`` of each finite value, as Python rounds it (the nearest double to
    the correctly rounded decimal, halfway cases to even); NaN for a non-finite one."""
    z = np.asarray(z, dtype=np.float64)
    out = np.full(z.shape, np.nan)
    finite = np.isfinite(z)
    with np.errstate(over="ignore", invalid="ignore"):
        y = z[finite] * _SCALE
        whole = np.rint(y)
        got = whole / _SCALE
        frac = np.abs(y - np.trunc(y))
        unsure = (np.abs(frac - 0.5) <= _HALFWAY_SLACK * np.maximum(1.0, np.abs(y))) | (
            np.abs(y) >= _EXACT_BELOW
        )
    if unsure.any():
        at = np.flatnonzero(unsure)
        got[at] = [round(v, Z_DECIMALS) for v in z[finite][at].tolist()]
    out[finite] = got
    return out


def z_step_columns(
    ranks: np.ndarray, values: np.ndarray, metric: str = "", config: DivergenceConfig | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``z_step`` of the step where rank ``ranks[i]`` has ``values[i]`` (ranks distinct), as
    columns: (the ranks ``z_step`` answers for, in the order given; their z, rounded, NaN for a
    non-finite value)."""
    ranks = np.asarray(ranks, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if ranks.size == 0:
        return ranks, np.zeros(0)
    detector = DivergenceDetector(replace(config or DivergenceConfig(), window_steps=0))
    result = detector.update_array("", metric, 0, ranks, values, len(ranks))
    scores = result.scores
    if isinstance(scores, RankScores):
        scored, z = scores.ranks, scores.z
    else:  # a small world, scored on lists
        by_rank = z_map(scores)
        scored = np.fromiter(by_rank.keys(), np.int64, len(by_rank))
        z = np.fromiter(by_rank.values(), np.float64, len(by_rank))
    return scored, round_z(z)
