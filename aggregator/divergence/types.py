"""The values the divergence detector hands out (re-exported by ``divergence.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StepStats:
    run: str
    metric: str
    step: int
    n: int  # ranks with a finite value
    median: float
    mad: float
    mean: float
    min: float
    max: float
    p5: float
    p25: float
    p75: float
    p95: float


def new_stats(*values: Any) -> StepStats:
    """``StepStats(*values)`` at half the cost: the frozen ``__init__`` makes 13
    ``object.__setattr__`` calls, this one dict update (scoring makes one per (metric, step))."""
    stats = object.__new__(StepStats)
    stats.__dict__.update(zip(_STATS_FIELDS, values, strict=True))
    return stats


_STATS_FIELDS = tuple(f.name for f in fields(StepStats))


@dataclass(frozen=True)
class RankScore:
    rank: int
    value: float
    z: float
    rel: float  # x / median for a positive median; 1 + (x - median) / |median| in general
    outlier: bool  # this step alone: |z| >= z_threshold and past the ratio gate
    nonfinite: bool
    flagged: bool = False  # a confirmed divergence of this rank and metric is active


@dataclass(frozen=True)
class Divergence:
    run: str
    metric: str
    rank: int
    kind: str  # nonfinite | outlier | offset | straggler (listing.KIND_ORDER)
    direction: str  # high | low
    since_step: int
    step: int  # step of this report (flagged, or resolved)
    value: float
    median: float
    z: float
    rel: float
    message: str
    n: int = 0  # ranks compared
    confident: bool = True  # False: two ranks and no way to tell which one changed


def new_divergence(*values: Any) -> Divergence:
    """``Divergence(*values)`` (every field given, in order) without the frozen ``__init__``'s
    ``object.__setattr__`` per field: a cascade flags every rank at once (``new_stats``)."""
    d = object.__new__(Divergence)
    d.__dict__.update(zip(_DIVERGENCE_FIELDS, values, strict=True))
    return d


_DIVERGENCE_FIELDS = tuple(f.name for f in fields(Divergence))

_RANKS, _VALUES, _Z, _REL, _OUTLIER = range(5)
_NO_FLAGS: frozenset[int] = frozenset()


class RankScores(Mapping[int, RankScore]):
    """rank -> RankScore for one step, built on access (4,096 objects per step are not free).

    The columns are lists (small worlds) or numpy arrays (large ones), all in one order. Bulk
    readers (the store, the live feed) get numpy arrays either way from ``ranks``,
    ``value_array`` (``values`` is the Mapping method), ``z``, ``rel`` and ``outlier``, and
    rank -> z from ``z_map()``.
    """

    def __init__(
        self,
        ranks: list[int] | np.ndarray,
        values: list[float] | np.ndarray,
        z: list[float] | np.ndarray,
        rel: list[float] | np.ndarray,
        outlier: Sequence[bool] | np.ndarray,
        flagged: frozenset[int],
    ) -> None:
        self._cols: list[Any] = [ranks, values, z, rel, outlier]
        self._flagged = flagged
        self._pos: dict[int, int] | None = None
        self._fill: Callable[[], tuple[list[float], list[float]]] | None = None

    @classmethod
    def lazy(
        cls,
        ranks: list[int],
        values: list[float],
        outlier: Sequence[bool],
        fill: Callable[[], tuple[list[float], list[float]]],
    ) -> RankScores:
        """Scores whose z and rel columns ``fill()`` computes on first read (most steps'
        scores are never read: the dashboard shows only the latest)."""
        scores = cls(ranks, values, None, None, outlier, _NO_FLAGS)  # type: ignore[arg-type]
        scores._fill = fill
        return scores

    def _filled(self) -> list[Any]:
        if self._fill is not None:
            self._cols[_Z], self._cols[_REL] = self._fill()
            self._fill = None
        return self._cols

    def _array(self, col: int, dtype: type) -> np.ndarray:
        value = self._filled()[col]
        if not isinstance(value, np.ndarray):
            value = self._cols[col] = np.asarray(value, dtype)
        return value

    def _list(self, col: int) -> list[Any]:
        value = self._filled()[col]
        return value.tolist() if isinstance(value, np.ndarray) else value

    @property
    def ranks(self) -> np.ndarray:
        return self._array(_RANKS, np.int64)

    @property
    def value_array(self) -> np.ndarray:
        return self._array(_VALUES, np.float64)

    @property
    def z(self) -> np.ndarray:
        return self._array(_Z, np.float64)

    @property
    def rel(self) -> np.ndarray:
        return self._array(_REL, np.float64)

    @property
    def outlier(self) -> np.ndarray:
        return self._array(_OUTLIER, np.bool_)

    def z_map(self) -> dict[int, float]:
        """rank -> z (NaN for a non-finite value), without building RankScore objects."""
        return dict(zip(self._list(_RANKS), self._list(_Z), strict=True))

    def __getitem__(self, rank: int) -> RankScore:
        if self._pos is None:
            self._pos = {r: i for i, r in enumerate(self._list(_RANKS))}
        i = self._pos[rank]
        _, values, z, rel, outlier = self._filled()
        value = float(values[i])
        return RankScore(
            rank,
            value,
            float(z[i]),
            float(rel[i]),
            bool(outlier[i]),
            not math.isfinite(value),
            rank in self._flagged,
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self._list(_RANKS))

    def __len__(self) -> int:
        return len(self._cols[_RANKS])


def z_map(scores: Mapping[int, RankScore]) -> dict[int, float]:
    """rank -> z of any scores mapping; RankScores answers without building RankScore objects."""
    if isinstance(scores, RankScores):
        return scores.z_map()
    return {r: s.z for r, s in scores.items()}


@dataclass(frozen=True)
class StepResult:
    stats: StepStats
    scores: Mapping[int, RankScore]
    new: list[Divergence]
    resolved: list[Divergence]


def new_result(
    stats: StepStats,
    scores: Mapping[int, RankScore],
    new: list[Divergence],
    resolved: list[Divergence],
) -> StepResult:
    """``StepResult(...)`` without the frozen ``__init__`` (one per scored (metric, step))."""
    result = object.__new__(StepResult)
    result.__dict__.update(stats=stats, scores=scores, new=new, resolved=resolved)
    return result
