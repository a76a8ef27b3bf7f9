"""Chart points as numpy columns, from DuckDB's ``fetchnumpy`` to the HTTP response.

An overlay of 1,024 ranks is about a million points. Built as Python lists (and then JSON) they
cost several times the query itself, so the read path keeps them as arrays: ``SeriesColumns``
holds every key's points concatenated in key order, a band is one array per statistic.
``SeriesColumns.to_lists`` and ``band_lists`` give the documented ``Store.series()`` /
``Store.band()`` shapes for callers that want lists. Pure numpy: no store, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np

BAND_KEYS = ("step", "median", "p5", "p95", "min", "max")  # Store.band() fields, in order


@dataclasses.dataclass(frozen=True, eq=False)
class SeriesColumns:
    """Points of several keys (ranks), concatenated in ascending key order: key ``keys[i]``
    owns rows ``offsets[i]:offsets[i + 1]`` of ``step`` (int64, increasing within a key),
    ``value``, ``low`` and ``high`` (float64; the extremes of the bucket the point was drawn
    from, ``value`` itself for raw rows). ``to_lists`` names ``low``/``high`` "min"/"max"."""

    keys: np.ndarray
    offsets: np.ndarray
    step: np.ndarray
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def empty(cls) -> SeriesColumns:
        f = np.zeros(0, np.float64)
        return cls(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64), f, f, f)

    @classmethod
    def from_rows(
        cls,
        key: np.ndarray,
        step: np.ndarray,
        value: np.ndarray,
        low: np.ndarray | None = None,
        high: np.ndarray | None = None,
    ) -> SeriesColumns:
        """Rows sorted by (key, step); ``low``/``high`` default to ``value`` (raw rows)."""
        key = np.asarray(key)
        if len(key) == 0:
            return cls.empty()
        firsts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
        v = _floats(value)
        return cls(
            keys=key[firsts].astype(np.int64),
            offsets=np.r_[firsts, len(key)].astype(np.int64),
            step=np.asarray(step).astype(np.int64, copy=False),
            value=v,
            low=v if low is None else _floats(low),
            high=v if high is None else _floats(high),
        )

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def points(self) -> int:
        return len(self.step)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def spans(self) -> Iterator[tuple[int, int, int]]:
        """(key, first row, end row) per key."""
        bounds = self.offsets.tolist()
        yield from zip(self.keys.tolist(), bounds[:-1], bounds[1:], strict=True)

    def to_lists(self) -> dict[int, dict[str, list]]:
        """key -> {"step", "value", "min", "max"} as plain Python lists (``Store.series()``)."""
        step, value = self.step.tolist(), self.value.tolist()
        low = value if self.low is self.value else self.low.tolist()
        high = value if self.high is self.value else self.high.tolist()
        return {
            k: {"step": step[a:b], "value": value[a:b], "min": low[a:b], "max": high[a:b]}
            for k, a, b in self.spans()
        }


def _floats(col: np.ndarray) -> np.ndarray:
    """float64, masked entries (SQL NULL) as NaN."""
    if isinstance(col, np.ma.MaskedArray):
        return np.ma.filled(col.astype(np.float64), math.nan)
    return np.asarray(col, dtype=np.float64)


def bucket_columns(
    key: np.ndarray,
    mn: np.ndarray,
    mn_step: np.ndarray,
    mx: np.ndarray,
    mx_step: np.ndarray,
    start: float,
    end: float,
) -> SeriesColumns:
    """Two points per bucket (its minimum and its maximum, in step order) so spikes survive.

    ``low``/``high`` repeat the bucket's extremes for every point drawn from it. Rows arrive
    sorted by (key, b); a bucket's extremes may lie just outside the requested range (buckets
    straddle its edges) and are dropped, and a one-point bucket is drawn once.
    """
    key = np.asarray(key)
    n = len(key)
    if n == 0:
        return SeriesColumns.empty()
    mn, mx = _floats(mn), _floats(mx)
    mn_step, mx_step = np.asarray(mn_step, np.int64), np.asarray(mx_step, np.int64)
    first_is_min = mn_step <= mx_step
    # (bucket, first/second point) laid out row-major: ravel() is the step order
    step = np.empty((n, 2), dtype=np.int64)
    value = np.empty((n, 2), dtype=np.float64)
    np.copyto(step[:, 0], np.where(first_is_min, mn_step, mx_step))
    np.copyto(step[:, 1], np.where(first_is_min, mx_step, mn_step))
    np.copyto(value[:, 0], np.where(first_is_min, mn, mx))
    np.copyto(value[:, 1], np.where(first_is_min, mx, mn))
    keep = (step >= start) & (step <= end)
    keep[:, 1] &= mn_step != mx_step
    low, high = np.repeat(mn, 2), np.repeat(mx, 2)
    # Offsets from the bucket rows (half as many as points); a key may have kept no point.
    firsts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    if keep.all():  # the usual case: only a window's edge buckets lose a point
        step, value = step.ravel(), value.ravel()
        ends = 2 * np.r_[firsts, n]
    else:
        flat = keep.ravel()
        step, value, low, high = step.ravel()[flat], value.ravel()[flat], low[flat], high[flat]
        per_bucket = keep[:, 0].astype(np.int64) + keep[:, 1]
        ends = np.r_[0, np.cumsum(per_bucket)][np.r_[firsts, n]]
    counts = np.diff(ends)
    nonempty = counts > 0
    return SeriesColumns(
        keys=key[firsts][nonempty].astype(np.int64),
        offsets=np.r_[0, np.cumsum(counts[nonempty])].astype(np.int64),
        step=step,
        value=value,
        low=low,
        high=high,
    )


def minmax_reduce(cols: SeriesColumns, max_points: int) -> SeriesColumns:
    """Cut every key's points to <= max_points by min/max per equal-width step bucket.

    The safety net for ranges where the level estimate was off (uneven logging density); keys
    already within the budget are passed through untouched.
    """
    counts = cols.counts
    over = np.flatnonzero(counts > max_points)
    if len(over) == 0:
        return cols
    row_key = np.repeat(cols.keys, counts)
    whole = (row_key, cols.step, cols.value, cols.low, cols.high)
    parts: list[list[np.ndarray]] = [[] for _ in whole]
    done = 0  # first row not yet copied
    for i in over.tolist():
        a, b = int(cols.offsets[i]), int(cols.offsets[i + 1])
        reduced = _reduce_one(cols.step[a:b], cols.value[a:b], cols.low[a:b], cols.high[a:b],
                              max_points)  # fmt: skip
        key = np.full(len(reduced[0]), cols.keys[i], dtype=np.int64)
        for part, col, new in zip(parts, whole, (key, *reduced), strict=True):
            part.extend((col[done:a], new))
        done = b
    for part, col in zip(parts, whole, strict=True):
        part.append(col[done:])
    return SeriesColumns.from_rows(*(np.concatenate(part) for part in parts))


def _reduce_one(
    step: np.ndarray, value: np.ndarray, lows: np.ndarray, highs: np.ndarray, max_points: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    buckets = max(1, max_points // 2)
    width = max(1, math.ceil((int(step[-1]) - int(step[0]) + 1) / buckets))
    group = (step - step[0]) // width
    # np.lexsort puts NaN last, so the last row of a group is its NaN or its maximum.
    order = np.lexsort((value, group))
    g = group[order]
    first = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    last = np.r_[first[1:] - 1, len(g) - 1]
    pick = np.sort(np.unique(np.r_[order[first], order[last]]))
    g_lo = np.minimum.reduceat(lows[order], first)
    g_hi = np.maximum.reduceat(highs[order], first)
    gid = np.searchsorted(np.unique(g), group[pick])
    return step[pick], value[pick], g_lo[gid], g_hi[gid]


def band_reduce(band: dict[str, np.ndarray], max_points: int) -> dict[str, np.ndarray]:
    """Cut band points to <= max_points equal-width step buckets: first step, mean median,
    lowest p5/min, highest p95/max (NaN, i.e. no finite value, ignored)."""
    step = np.asarray(band["step"], dtype=np.int64)
    if len(step) <= max_points:
        return band
    width = max(1, math.ceil((int(step[-1]) - int(step[0]) + 1) / max_points))
    group = (step - step[0]) // width
    first = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    out = {"step": step[first]}
    med = np.asarray(band["median"], dtype=np.float64)
    ok = ~np.isnan(med)
    sums = np.add.reduceat(np.where(ok, med, 0.0), first)
    counts = np.add.reduceat(ok.astype(np.int64), first)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["median"] = np.where(counts > 0, sums / counts, math.nan)
    for name, fn in (("p5", np.fmin), ("p95", np.fmax), ("min", np.fmin), ("max", np.fmax)):
        out[name] = fn.reduceat(np.asarray(band[name], dtype=np.float64), first)
    return out


def empty_band() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, np.int64 if k == "step" else np.float64) for k in BAND_KEYS}


def band_lists(band: dict[str, np.ndarray]) -> dict[str, list]:
    """A band's arrays as plain Python lists (``Store.band()``)."""
    return {k: np.asarray(band[k]).tolist() for k in BAND_KEYS}
