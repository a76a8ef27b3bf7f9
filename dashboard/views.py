"""Pure helpers behind the routes: parsing query values and shaping the aggregator's views.

No I/O here: the routes pass in what they read from the ``DataProvider`` (snapshot, store).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from rankwatch.aggregator.provider import (
    ZGrid,
    display_order,
    telemetry_info,
    z_columns,
    z_grid,
    z_step,
    z_step_columns,
)

BAND_THRESHOLD_RANKS = 32  # above this many ranks a chart shows a band, not every line
MAX_OUTLIER_RANKS = 24  # individual lines drawn in band mode besides the selected ranks
MAX_SELECTED_RANKS = 256  # ranks one URL may select
MAX_RANK_ID = 1 << 20  # a rank id beyond this is a typo, not a cluster
TELEMETRY_POINTS = 600  # points per rank of a hardware chart by default
TELEMETRY_EXTREMES = 8  # ranks furthest from their peers drawn as lines in band mode

# Order of the charts: the usual training metrics first, anything custom after them.
METRIC_ORDER = display_order()


def parse_ranks(text: str | None) -> list[int]:
    """``"0,3,8-11"`` -> ``[0, 3, 8, 9, 10, 11]``; raises ValueError with a readable reason."""
    if text is None or not text.strip():
        return []
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f"'{part[:20]}' is not a rank or a range like 8-11") from None
        if lo < 0 or hi < lo or hi > MAX_RANK_ID:
            raise ValueError(f"'{part[:20]}' is not a valid rank range")
        if len(out) + (hi - lo + 1) > MAX_SELECTED_RANKS:
            raise ValueError(f"at most {MAX_SELECTED_RANKS} ranks can be selected")
        out.update(range(lo, hi + 1))
    return sorted(out)


def find_run(snapshot: Mapping[str, Any], run: str) -> dict[str, Any] | None:
    for entry in snapshot.get("runs", []):
        if entry.get("run") == run:
            return entry
    return None


def merge_runs(
    stored: Sequence[Mapping[str, Any]], snapshot: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One row per run: history from the store, live state from the snapshot.

    A run may be in only one of them: just started (not flushed yet) or from an earlier
    session of the aggregator (in the store, no live state).
    """
    live = {r.get("run"): r for r in snapshot.get("runs", [])}
    rows: dict[str, dict[str, Any]] = {}
    for entry in stored:
        name = entry["run"]  # every stored run has its name (StoredRun)
        ranks = entry.get("ranks")
        rows[name] = {
            "run": name,
            # Not in the live state: from before this aggregator started, or retired long after
            # it ended. Only the store knows it now.
            "state": "history",
            "world_size": entry.get("world_size"),
            "ranks": len(ranks) if isinstance(ranks, (list, tuple, set)) else ranks,
            "start": entry.get("first_time"),
            "last_time": entry.get("last_time"),
            "last_step": entry.get("last_step"),
            "records": entry.get("records"),
            "divergences": 0,
        }
    for name, entry in live.items():
        row = rows.setdefault(name, {"run": name, "start": None, "records": None})
        row.update(
            state=entry.get("state"),
            world_size=entry.get("world_size") or row.get("world_size"),
            ranks=len(entry.get("ranks") or []) or entry.get("ranks_seen") or row.get("ranks"),
            last_step=row.get("last_step")
            if entry.get("last_step") is None
            else entry["last_step"],
            divergences=entry.get("divergences_active", len(entry.get("divergences") or [])),
        )
        if entry.get("last_time") is not None:
            row["last_time"] = max(entry["last_time"], row.get("last_time") or 0.0)
    return sorted(rows.values(), key=lambda r: -(r.get("last_time") or 0.0))


def rank_count(run_entry: Mapping[str, Any] | None, stored_ranks: Iterable[int] = ()) -> int:
    if run_entry is None:
        return len(set(stored_ranks))
    seen = len(run_entry.get("ranks") or []) or int(run_entry.get("ranks_seen") or 0)
    return max(int(run_entry.get("world_size") or 0), seen)


def outlier_ranks(
    run_entry: Mapping[str, Any] | None,
    metric: str,
    alerted: Iterable[tuple[int | None, str | None]] = (),
    first: Iterable[int] = (),
) -> list[int]:
    """Ranks worth a line of their own on ``metric``: ``first`` (an incident's ranks), flagged
    now, or alerted on it before."""
    found: list[int] = []

    def add(rank: Any) -> None:
        if isinstance(rank, int) and rank not in found:
            found.append(rank)

    for culprit in first:
        add(culprit)

    if run_entry is not None:
        for div in run_entry.get("divergences") or []:
            if div.get("metric") == metric:
                add(div.get("rank"))
        for rank in run_entry.get("ranks") or []:
            if metric in (rank.get("divergent") or []):
                add(rank.get("rank"))
    for rank, alert_metric in alerted:
        if alert_metric == metric:
            add(rank)
    return found[:MAX_OUTLIER_RANKS]


def order_metrics(names: Iterable[str]) -> list[str]:
    """Known training metrics first in a fixed order, loss components after loss, then the rest."""

    def key(name: str) -> tuple[int, str]:
        if name in METRIC_ORDER:
            return (METRIC_ORDER.index(name) * 2, "")
        if name.startswith("loss"):
            return (1, name)  # loss components right after loss
        return (len(METRIC_ORDER) * 2, name)

    return sorted(set(names), key=key)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def robust_z_columns(
    per_rank: Mapping[int, Sequence[float | None]], columns: int, metric: str = ""
) -> dict[int, list[float | None]]:
    """The heatmap's cells: the detector's robust z of each column (``divergence.zgrid``)."""
    return z_columns(per_rank, columns, metric)


def latest_z(values: Mapping[int, float], metric: str = "") -> dict[int, float]:
    """The detector's z of each rank's latest value (a stored run's rank table)."""
    return z_step(values, metric)


def latest_z_columns(
    ranks: np.ndarray, values: np.ndarray, metric: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``latest_z`` of rank ``ranks[i]``'s latest value ``values[i]``, as columns: (ranks, z)."""
    return z_step_columns(ranks, values, metric)


def heat_grid(
    per_rank: Mapping[int, Sequence[float | None]], columns: int, metric: str = ""
) -> ZGrid:
    """The heatmap's cells and, per cell, whether the detector had the rank flagged there."""
    return z_grid(per_rank, columns, metric)


def bucket_series(
    series: Mapping[int, Mapping[str, Sequence[Any]]], buckets: int
) -> tuple[list[int], int, dict[int, list[float | None]]]:
    """Put every rank's points on one shared step grid of at most ``buckets`` columns.

    Returns the first step of each column, the column width in steps, and per rank the mean
    of its points in each column (None where it has none, NaN where any point is non-finite,
    so a single NaN step is never averaged away).
    """
    steps = [s for data in series.values() for s in data.get("step", [])]
    if not steps:
        return [], 1, {}
    lo, hi = min(steps), max(steps)
    width = max(1, math.ceil((hi - lo + 1) / max(1, buckets)))
    columns = (hi - lo) // width + 1
    grid: dict[int, list[float | None]] = {}
    for rank, data in series.items():
        sums = [0.0] * columns
        counts = [0] * columns
        bad = [False] * columns
        for step, value in zip(data.get("step", []), data.get("value", []), strict=True):
            col = (step - lo) // width
            if value is None:
                continue
            v = _finite(value)
            if v is None or not math.isfinite(v):
                bad[col] = True
                counts[col] += 1
                continue
            sums[col] += v
            counts[col] += 1
        grid[rank] = [
            (math.nan if bad[c] else sums[c] / counts[c]) if counts[c] else None
            for c in range(columns)
        ]
    return [lo + c * width for c in range(columns)], width, grid


def telemetry_entry(name: str) -> dict[str, Any]:
    """What the page needs to draw a telemetry metric's chart."""
    m = telemetry_info(name)
    # a share, a size, a rate, a power or a clock below 0 is impossible: the axis starts at 0
    nonnegative = m.unit in ("%", "B", "B/s", "W", "MHz") or name.endswith("_total")
    return {"name": name, "unit": m.unit, "title": m.title, "chart": m.chart,
            "direction": m.direction, "nonnegative": nonnegative}  # fmt: skip


def telemetry_shown(hardware: Mapping[str, Any], metric: str, selected: Sequence[int]) -> list[int]:
    """The ranks drawn as lines over the band: flagged on ``metric``, the ones furthest from
    their peers (its bad direction), the selected ones."""
    m = telemetry_info(metric)
    z = hardware.get("z", {}).get(metric, {})
    sign = -1.0 if m.direction == "low" else 1.0
    far = sorted(z, key=lambda r: -sign * z[r] if m.direction != "off" else -abs(z[r]))
    extremes = [r for r in far[:TELEMETRY_EXTREMES] if abs(z[r]) >= 2.0]
    return sorted({*hardware.get("outliers", {}).get(metric, []), *extremes, *selected})
