"""What a run's summary says of its active divergences: the first few, and how many in all.

Pure. A cascade makes every rank's divergence active at once: one card's NaN reaches every
rank within a step, and each rank's loss and gradient norms are then flagged non-finite. A
summary that listed every active divergence grew with the ranks (docs/benchmarks.md, "Reads
during a cascade"), under the lock ingest needs. It lists the first ``SHOWN`` in the order a
person reads them and counts all of them: the earliest start first (the card that started
it), non-finite before outliers before offsets, then the largest |z|, then by rank and
metric. The flags of a (run, metric) live in an ``ActiveFlags``, whose ``version`` changes
with every flag set or cleared, so a listing is made again only when a flag changed.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import count
from operator import attrgetter
from typing import Any

from rankwatch.aggregator.divergence.types import Divergence

SHOWN = 64  # the active divergences a run's summary lists: every one of a few bad cards
# every kind of divergence, in the order a summary lists those that started at the same step
KIND_ORDER = {"nonfinite": 0, "outlier": 1, "offset": 2, "straggler": 3}

_versions = count(1)  # one sequence for every ActiveFlags: a version is never reused
_NOT_GIVEN: Any = object()
_kind, _rank = attrgetter("kind"), attrgetter("rank")


class ActiveFlags(dict[tuple[int, str], Divergence]):
    """A (run, metric)'s active flags, (rank, kind) -> divergence: a dict that takes a new
    ``version`` at every change."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        super().__init__()
        self.version = next(_versions)

    def __setitem__(self, key: tuple[int, str], value: Divergence) -> None:
        super().__setitem__(key, value)
        self.version = next(_versions)

    def __delitem__(self, key: tuple[int, str]) -> None:
        super().__delitem__(key)
        self.version = next(_versions)

    def pop(self, key: tuple[int, str], default: Any = _NOT_GIVEN) -> Any:
        self.version = next(_versions)
        if default is _NOT_GIVEN:
            return super().pop(key)
        return super().pop(key, default)

    def popitem(self) -> tuple[tuple[int, str], Divergence]:
        self.version = next(_versions)
        return super().popitem()

    def clear(self) -> None:
        super().clear()
        self.version = next(_versions)

    def setdefault(self, key: tuple[int, str], default: Any = None) -> Any:
        self.version = next(_versions)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self.version = next(_versions)

    def __ior__(self, other: Any) -> ActiveFlags:  # type: ignore[override,misc]
        self.update(other)
        return self


@dataclass(frozen=True)
class ActiveList:
    """A run's active divergences as a summary gives them."""

    total: int  # active in all
    listed: list[Divergence]  # the first ``SHOWN`` in reading order
    by_kind: dict[str, int]  # kind -> active, kinds in ``KIND_ORDER``
    ranks: frozenset[int]  # every rank with an active divergence


def reading_order(d: Divergence) -> tuple[int, int, float, int, str]:
    """The sort key of ``list_active``: earliest start, kind, largest |z| (a non-finite value
    has none: the largest), rank, metric."""
    return (
        d.since_step,
        _kind_rank(d.kind),
        -abs(d.z) if d.z == d.z else -math.inf,
        d.rank,
        d.metric,
    )


def list_active(active: Iterable[Divergence], limit: int = SHOWN) -> ActiveList:
    """The summary of ``active`` (every active divergence of one run). The passes over every
    divergence are in C but for the ordering of the first ``limit``: a cascade is one per rank
    and metric."""
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    every = list(active)
    kinds = Counter(map(_kind, every))
    return ActiveList(
        len(every),
        heapq.nsmallest(limit, every, key=reading_order),
        {k: kinds[k] for k in sorted(kinds, key=lambda k: (_kind_rank(k), k))},
        frozenset(map(_rank, every)),
    )


def _kind_rank(kind: str) -> int:
    return KIND_ORDER.get(kind, len(KIND_ORDER))
