"""The robust z of a rank x column grid (the dashboard's heatmap), scored by the detector.

Each column goes through a ``DivergenceDetector`` as one step, in column order, so a cell's z is
the one the detector computes for those values: the same ``robust.robust_scale`` with the same
floors, the typical spread learned over the columns before it, the metric's own rule. The
heatmap cannot paint a rank far off where the detector's own z says it is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.divergence.types import z_map
from rankwatch.aggregator.merge import StepValues

Z_DECIMALS = 2  # a heatmap cell's z is shown to this many decimals

__all__ = ["z_columns"]


def z_columns(
    per_rank: Mapping[int, Sequence[float | None]],
    columns: int,
    metric: str = "",
    config: DivergenceConfig | None = None,
) -> dict[int, list[float | None]]:
    """Robust z per rank per column: None where a rank has no value, NaN where its value is
    not finite (or no rank's is), else the detector's z for that column, rounded."""
    detector = DivergenceDetector(config)
    out: dict[int, list[float | None]] = {rank: [None] * columns for rank in per_rank}
    for col in range(columns):
        values: dict[int, float] = {}
        for rank, row in per_rank.items():
            v = row[col] if col < len(row) else None
            if v is not None:
                values[rank] = float(v)
        if not values:
            continue
        result = detector.update(StepValues("", metric, col, values, len(values), True))
        for rank, z in z_map(result.scores).items():
            out[rank][col] = round(z, Z_DECIMALS) if math.isfinite(z) else math.nan
    return out
