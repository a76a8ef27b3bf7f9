"""The robust z of a rank x column grid (the dashboard's heatmap), scored by the detector.

Each column goes through a ``DivergenceDetector`` as one step, in column order, so a cell's z is
the one the detector computes for those values: the same ``robust.robust_scale`` with the same
floors, the typical spread learned over the columns before it, the metric's own rule. The
heatmap cannot paint a rank far off where the detector's own z says it is not.

A large z alone is not a fault: one step's jump can reach |z| of 6 on a healthy run, and the
detector never flags it (a single step never confirms). So the grid also carries, per cell,
whether the detector had a confirmed divergence of that rank active at that column (its
active divergences after the column's CUSUM update: what ``RankScore.flagged`` says), back to
the column the divergence says it began at: the page paints the fault colour there and
nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.divergence.types import z_map
from rankwatch.aggregator.merge import StepValues

Z_DECIMALS = 2  # a heatmap cell's z is shown to this many decimals

__all__ = ["ZGrid", "z_columns", "z_grid", "z_step"]


@dataclass(frozen=True)
class ZGrid:
    z: dict[int, list[float | None]]  # rank -> per column: None (no value), NaN, or the z
    flagged: dict[int, list[bool]]  # rank -> per column: the detector had this rank flagged


def z_grid(
    per_rank: Mapping[int, Sequence[float | None]],
    columns: int,
    metric: str = "",
    config: DivergenceConfig | None = None,
) -> ZGrid:
    """Robust z per rank per column: None where a rank has no value, NaN where its value is
    not finite (or no rank's is), else the detector's z for that column, rounded; and
    whether the detector had a divergence of the rank active at the column (from its
    ``since_step`` on)."""
    detector = DivergenceDetector(config)
    z: dict[int, list[float | None]] = {rank: [None] * columns for rank in per_rank}
    flagged: dict[int, list[bool]] = {rank: [False] * columns for rank in per_rank}
    for col in range(columns):
        values: dict[int, float] = {}
        for rank, row in per_rank.items():
            v = row[col] if col < len(row) else None
            if v is not None:
                values[rank] = float(v)
        if not values:
            continue
        result = detector.update(StepValues("", metric, col, values, len(values), True))
        for rank, value in z_map(result.scores).items():
            z[rank][col] = round(value, Z_DECIMALS) if math.isfinite(value) else math.nan
        for d in detector.active():  # what RankScore.flagged reads, without a score per rank
            if d.rank in flagged:
                flagged[d.rank][col] = True
        # A new flag names the column its divergence began at: the cells in between are the
        # evidence that confirmed it, and the alert says "since" that column.
        for d in result.new:
            if d.rank in flagged and 0 <= d.since_step < col:
                flagged[d.rank][d.since_step : col] = [True] * (col - d.since_step)
    return ZGrid(z, flagged)


def z_columns(
    per_rank: Mapping[int, Sequence[float | None]],
    columns: int,
    metric: str = "",
    config: DivergenceConfig | None = None,
) -> dict[int, list[float | None]]:
    """``z_grid(...).z``: the cells' z alone."""
    return z_grid(per_rank, columns, metric, config).z


def z_step(
    values: Mapping[int, float], metric: str = "", config: DivergenceConfig | None = None
) -> dict[int, float]:
    """rank -> the detector's z of one step of ``values`` with no history (a one-column
    ``z_columns``, without a list per rank: a stored run's latest values of 100,000 ranks),
    rounded; NaN for a non-finite value."""
    if not values:
        return {}
    detector = DivergenceDetector(config)
    result = detector.update(StepValues("", metric, 0, dict(values), len(values), True))
    return {
        rank: round(value, Z_DECIMALS) if math.isfinite(value) else math.nan
        for rank, value in z_map(result.scores).items()
    }
