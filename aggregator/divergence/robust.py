"""The robust z-score: the one definition the detector scores with and the heatmap paints.

``z = (x - median) / scale`` across the ranks of one step, ``scale`` being ``1.4826 * MAD``
floored by ``rel_floor * |median|``, by ``abs_floor``, and by the pooled scale: ``spread_pool``
times ``c(n)`` times the run's recent typical relative spread (an EWMA of ``1.4826 * MAD /
|median|`` over past steps). A pair, whose MAD is just its own distance, takes the typical
spread alone.

Why pooled: the MAD of a few ranks is a poor yardstick (at 8 ranks ``E[1.4826 * MAD]`` is
0.89 sigma and varies by a third from step to step), so z-scores against it have heavy tails
and a small world raises ~90x the false alarms the budget allows (docs/benchmarks.md). The
typical spread averages that estimate over ~20 steps. ``c(n)`` removes its small-sample bias:
the standard deviation of ``x - median`` over the mean of ``1.4826 * MAD``, for normal ranks
(``small_sample_factor``). The step's own MAD stays as a floor, so a step where every rank is
noisier than usual is scored against that; from ``SLACK_RANKS`` ranks up, once a typical spread
is known, shrunk by ``mad_slack(n)`` (two standard deviations of its own noise): the larger of
two estimates of the same spread is biased up (2 % at 1,024 ranks), and a 2 % larger scale
costs 0.035 of the 3 sigma recall within 5 steps. Smaller worlds keep it whole: there the bias
is what holds the heavy tails of ``x - median`` of a few values in check (8 ranks, 10 run-hours:
1 false alarm with it whole, 6 shrunk; on the real 4-rank traces a shrunk floor let a healthy
rank at 2.0x its real distance be flagged, against 2.65x).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config derives its limits from ztail, which reads this module
    from rankwatch.aggregator.divergence.config import DivergenceConfig, MetricRule

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
SLACK_RANKS = 64  # from this many ranks the step's own MAD floor is shrunk by mad_slack

# n -> sd(x - median) / E[1.4826 MAD] of n normal values (400,000 samples each); from 8 on
# 1 + 0.6 / n is within 0.01 of it.
_SMALL_SAMPLE = {3: 1.315, 4: 1.216, 5: 1.147, 6: 1.117, 7: 1.093}


def small_sample_factor(n: int) -> float:
    """``c(n)``: what the typical spread (a mean of ``1.4826 * MAD / |median|``) is multiplied
    by to be the standard deviation of ``x - median`` in a step of ``n`` ranks."""
    if n < 3:
        return 1.0
    return _SMALL_SAMPLE.get(n) or 1.0 + 0.6 / n


def mad_slack(n: int) -> float:
    """How much larger than the typical spread a step's own ``1.4826 * MAD`` must be to be the
    scale: two of its relative standard deviations (about 1.2 / sqrt(n) for normal ranks)."""
    return 1.0 + 2.4 / math.sqrt(n)


def robust_scale(
    cfg: DivergenceConfig, rule: MetricRule, n: int, median: float, mad: float, typical: float
) -> float:
    """The z-score denominator of a step of ``n`` finite ranks (``typical``: the run's recent
    relative spread, 0 when none is known yet)."""
    absmed = abs(median)
    abs_floor = rule.abs_floor or cfg.abs_floor
    if n == 2:  # the MAD of two values is their own distance: history only
        return max(absmed * max(rule.rel_floor or 0.0, typical), abs_floor)
    rel_scale = max(rule.rel_floor or 0.0, cfg.spread_pool * small_sample_factor(n) * typical)
    own = MAD_TO_SIGMA * mad
    if typical > 0 and n >= SLACK_RANKS:  # fewer ranks: their MAD floor keeps its full weight
        own = own / mad_slack(n)
    return max(own, absmed * rel_scale, abs_floor)
