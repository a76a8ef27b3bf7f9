"""Spike-preserving downsampling for charts: per bucket keep the min and the max, never sample.

A loss spike that lasts one step is exactly what a person opens the dashboard to see, so it must
survive any zoom level: each bucket of consecutive points keeps its lowest and its highest point,
in step order. Non-finite values (NaN, ±Inf) are markers and are kept: every run of consecutive
non-finite values of one kind keeps its first and last point (thinned only if those markers alone
would fill more than half of ``max_points``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_POINTS = 2  # one bucket's min and max

__all__ = ["bucket_bounds", "minmax", "minmax_indices"]


def bucket_bounds(n: int, buckets: int) -> np.ndarray:
    """``buckets + 1`` increasing indices splitting ``range(n)`` into near-equal slices."""
    if n < 0 or buckets < 1:
        raise ValueError(f"need n >= 0 and buckets >= 1, got n={n}, buckets={buckets}")
    buckets = min(buckets, max(n, 1))
    return np.linspace(0, n, buckets + 1).round().astype(np.int64)


def minmax_indices(values: Sequence[float] | np.ndarray, max_points: int) -> np.ndarray:
    """Sorted indices of the points to keep (so a caller can pick other columns with them)."""
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be >= {MIN_POINTS}, got {max_points}")
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    finite = np.isfinite(v)
    markers = _marker_indices(v, finite, max_points // 2)
    budget = max_points - markers.size
    keep = [markers]
    fin_idx = np.flatnonzero(finite)
    if fin_idx.size and budget >= MIN_POINTS:
        fv = v[fin_idx]
        bounds = bucket_bounds(fin_idx.size, budget // 2)
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            if hi > lo:
                seg = fv[lo:hi]
                keep.append(fin_idx[[lo + int(seg.argmin()), lo + int(seg.argmax())]])
    return np.unique(np.concatenate(keep))


def minmax(
    steps: Sequence[int], values: Sequence[float], max_points: int
) -> tuple[list[int], list[float]]:
    """At most ``max_points`` (step, value) points, each bucket's min and max in step order.

    ``steps`` must be increasing (the store returns them sorted); ValueError otherwise.
    """
    if len(steps) != len(values):
        raise ValueError(f"{len(steps)} steps but {len(values)} values")
    s = np.asarray(steps, dtype=np.int64)
    if s.size > 1 and not bool((np.diff(s) >= 0).all()):
        raise ValueError("steps must be in increasing order")
    idx = minmax_indices(values, max_points)
    v = np.asarray(values, dtype=np.float64)
    return s[idx].tolist(), v[idx].tolist()


def _marker_indices(v: np.ndarray, finite: np.ndarray, limit: int) -> np.ndarray:
    if finite.all():
        return np.zeros(0, np.int64)
    # A code per point: 0 finite, 1 NaN, 2 +Inf, 3 -Inf; runs break where the code changes.
    code = np.where(finite, 0, np.where(np.isnan(v), 1, np.where(v > 0, 2, 3)))
    change = np.flatnonzero(np.diff(code)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [v.size]]) - 1
    bad = code[starts] != 0
    idx = np.unique(np.concatenate([starts[bad], ends[bad]]))
    if idx.size > limit:
        # Too many markers: keep the first of each equal slice, always the very first one.
        bounds = bucket_bounds(idx.size, max(limit, 1))
        idx = idx[bounds[:-1]]
    return idx
