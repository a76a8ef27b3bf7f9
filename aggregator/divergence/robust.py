"""The robust z-score: the one definition the detector scores with and the heatmap paints.

``z = (x - median) / scale`` across the ranks of one step, ``scale`` being ``1.4826 * MAD``
floored so that a step where the healthy ranks happen to agree closely does not blow up the z of
the one that differs a little: by ``rel_floor * |median|``, by ``abs_floor``, and by
``spread_pool`` times the run's recent typical relative spread (a pair, whose MAD is just its
own distance, by the typical spread alone).
"""

from __future__ import annotations

from rankwatch.aggregator.divergence.config import DivergenceConfig, MetricRule

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


def robust_scale(
    cfg: DivergenceConfig, rule: MetricRule, n: int, median: float, mad: float, typical: float
) -> float:
    """The z-score denominator of a step of ``n`` finite ranks (``typical``: the run's recent
    relative spread, 0 when none is known yet)."""
    absmed = abs(median)
    abs_floor = rule.abs_floor or cfg.abs_floor
    if n == 2:  # the MAD of two values is their own distance: history only
        return max(absmed * max(rule.rel_floor or 0.0, typical), abs_floor)
    rel_scale = max(rule.rel_floor or 0.0, cfg.spread_pool * typical)
    return max(MAD_TO_SIGMA * mad, absmed * rel_scale, abs_floor)
