"""What a grouped alert needs of its ranks' conditions, kept up to date as they change.

With 50,000 ranks lost, a pass where 100 of them change would otherwise rebuild the grouped
alert from all 50,000: a sort of the ranks, the earliest start, the worst severity. ``RankedGroup``
keeps those as the conditions come and go (``Conds.put`` and ``pop``): the ranks in order with
the changes since the last read merged in by bisection, the earliest starts as counted heaps,
the severities as counts.

Pure.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from rankwatch.aggregator.alerts.config import SEVERITIES

if TYPE_CHECKING:
    from rankwatch.aggregator.alerts.conds import Cond

T = TypeVar("T", int, float)

# Changed ranks merged into the sorted ones one by one up to this share of them; beyond it a
# fresh sort is cheaper.
MERGE_SHARE = 1 / 16


class MinCount(Generic[T]):
    """A multiset's minimum under adds and removes (a heap with lazy deletion)."""

    def __init__(self) -> None:
        self._count: dict[T, int] = {}
        self._heap: list[T] = []

    def add(self, v: T) -> None:
        n = self._count.get(v, 0)
        self._count[v] = n + 1
        if n == 0:
            heapq.heappush(self._heap, v)

    def add_many(self, values: Iterable[T]) -> None:
        """``add`` of each value (a cascade's conditions share their start: counted once)."""
        count, heap = self._count, self._heap
        for v, n in Counter(values).items():
            had = count.get(v, 0)
            count[v] = had + n
            if had == 0:
                heapq.heappush(heap, v)

    def remove(self, v: T) -> None:
        n = self._count[v] - 1
        if n:
            self._count[v] = n
        else:
            del self._count[v]
        if len(self._heap) > 2 * len(self._count) + 16:  # stale entries: compact
            self._heap = list(self._count)
            heapq.heapify(self._heap)

    def min(self) -> T | None:
        heap, count = self._heap, self._count
        while heap and heap[0] not in count:
            heapq.heappop(heap)
        return heap[0] if heap else None


class RankedGroup:
    """One group's per-rank conditions and their grouped alert's parts."""

    def __init__(self) -> None:
        self.by_rank: dict[int, Cond] = {}
        self._sorted: list[int] = []
        self._added: set[int] = set()  # in by_rank, not yet in _sorted
        self._removed: set[int] = set()  # in _sorted, no longer in by_rank
        self._ranks: tuple[int, ...] | None = ()
        self._times: MinCount[float] = MinCount()
        self._steps: MinCount[int] = MinCount()
        self._severities: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.by_rank)

    def put(self, rank: int, cond: Cond) -> None:
        old = self.by_rank.get(rank)
        if old is not None:
            self._forget(old)
        elif rank in self._removed:
            self._removed.discard(rank)
        else:
            self._added.add(rank)
            self._ranks = None
        self.by_rank[rank] = cond
        self._times.add(cond.since_time)
        if cond.since_step is not None:
            self._steps.add(cond.since_step)
        self._severities[cond.severity] += 1

    def put_many(self, conds: Mapping[int, Cond]) -> None:
        """``put`` of each rank's condition, the same state after: the parts counted once for
        them all (a cascade's step puts every rank's at once)."""
        by_rank, added, removed = self.by_rank, self._added, self._removed
        for rank in conds:
            old = by_rank.get(rank)
            if old is not None:
                self._forget(old)
            elif rank in removed:
                removed.discard(rank)
            else:
                added.add(rank)
                self._ranks = None
        by_rank.update(conds)
        values = conds.values()
        self._times.add_many(c.since_time for c in values)
        self._steps.add_many(c.since_step for c in values if c.since_step is not None)
        self._severities.update(c.severity for c in values)

    def pop(self, rank: int) -> None:
        old = self.by_rank.pop(rank, None)
        if old is None:
            return
        self._forget(old)
        if rank in self._added:
            self._added.discard(rank)
        else:
            self._removed.add(rank)
        self._ranks = None

    def _forget(self, cond: Cond) -> None:
        self._times.remove(cond.since_time)
        if cond.since_step is not None:
            self._steps.remove(cond.since_step)
        left = self._severities[cond.severity] - 1
        if left:
            self._severities[cond.severity] = left
        else:
            del self._severities[cond.severity]

    def ranks(self) -> tuple[int, ...]:
        """The ranks, in order."""
        if self._ranks is None:
            changed = len(self._added) + len(self._removed)
            if changed > MERGE_SHARE * len(self._sorted):
                self._sorted = sorted(self.by_rank)
            else:
                ranks = self._sorted
                for rank in self._removed:
                    del ranks[bisect_left(ranks, rank)]
                for rank in self._added:
                    insort(ranks, rank)
            self._added, self._removed = set(), set()
            self._ranks = tuple(self._sorted)
        return self._ranks

    def since_time(self) -> float | None:
        return self._times.min()

    def since_step(self) -> int | None:
        return self._steps.min()

    def severity(self) -> str:
        return max(self._severities, key=SEVERITIES.index)
