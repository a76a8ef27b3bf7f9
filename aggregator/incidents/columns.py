"""Evidence column by column: a burst of new facts (``Rows``) and an incident's facts of one
kind and metric (``Column``). Pure.

A fault at 4,096 ranks arrives as thousands of facts alike but for their rank. Held as one
tuple per fact, building, keying and scanning them is most of what a burst costs; held as
columns (a list of ranks, of steps, of times ...) they are added and read with ``map``,
``zip`` and ``compress`` in C, and a ``Fact`` is made only for the few a person sees.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, islice, repeat
from operator import attrgetter, eq, le
from typing import Protocol, TypeVar

from rankwatch.aggregator.incidents.rules import Fact, known
from rankwatch.aggregator.incidents.scan import positions

__all__ = ["Column", "Rows", "by_run", "merge_sorted", "rows_of"]

_new = tuple.__new__
_FIELDS = ("kind", "rank", "step", "time", "metric", "what", "detail", "raw")  # Fact's order
Text = str | Iterable[str]  # one text for every row, or one per row
_FEW_MOVED = 8  # keys put into a sorted list one by one; more are merged in one sort


class Rows:
    """New facts, one row per fact, in the column order of ``Fact``."""

    __slots__ = _FIELDS

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.rank: list[int] = []
        self.step: list[int | None] = []
        self.time: list[float] = []
        self.metric: list[str] = []
        self.what: list[str] = []
        self.detail: list[str] = []
        self.raw: list[str] = []

    def __len__(self) -> int:
        return len(self.rank)

    def add(self, fact: Fact) -> None:
        for name, value in zip(_FIELDS, fact, strict=True):
            getattr(self, name).append(value)

    def extend(
        self,
        kind: str,
        ranks: Sequence[int],
        steps: Iterable[int | None],
        times: Iterable[float],
        metric: Text = "",
        what: Text = "",
        detail: Text = "",
        raw: Text = "",
    ) -> None:
        n = len(ranks)
        self.kind.extend(repeat(kind, n))
        self.rank.extend(ranks)
        self.step.extend(steps)
        self.time.extend(times)
        for column, value in ((self.metric, metric), (self.what, what),
                              (self.detail, detail), (self.raw, raw)):  # fmt: skip
            column.extend(repeat(value, n) if isinstance(value, str) else value)

    def fact(self, i: int) -> Fact:
        return _new(Fact, (self.kind[i], self.rank[i], self.step[i], self.time[i],
                           self.metric[i], self.what[i], self.detail[i], self.raw[i]))  # fmt: skip

    def facts(self) -> list[Fact]:
        columns = [getattr(self, name) for name in _FIELDS]
        return list(map(_new, repeat(Fact), zip(*columns, strict=True)))

    def sort(self) -> None:
        """By (time, rank), rows of the same time and rank in their order."""
        times, ranks = self.time, self.rank
        if not times:
            return
        in_rank_order = all(map(le, ranks, islice(ranks, 1, None)))
        if times.count(times[0]) == len(times):  # one time throughout: by rank alone
            if in_rank_order:
                return
        elif all(map(le, times, islice(times, 1, None))):
            by_rank = map(le, ranks, islice(ranks, 1, None))
            if in_rank_order or all(compress(by_rank, map(eq, times, islice(times, 1, None)))):
                return  # already in order: the common burst
        # by rank, then by time; most often by rank already (a burst is made from a dict by rank)
        n = len(ranks)
        order = list(range(n)) if in_rank_order else sorted(range(n), key=ranks.__getitem__)
        if times.count(times[0]) < len(times):  # one time throughout: by rank is the order
            order.sort(key=times.__getitem__)
        self._reorder(order)

    def take(self, rows: list[int]) -> Rows:
        """The rows at these indices (in order), as a new ``Rows``."""
        out = Rows()
        if rows and rows[-1] - rows[0] + 1 == len(rows):  # a run of rows: slices
            cut = slice(rows[0], rows[-1] + 1)
            for name in _FIELDS:
                setattr(out, name, getattr(self, name)[cut])
        else:
            for name in _FIELDS:
                setattr(out, name, list(map(getattr(self, name).__getitem__, rows)))
        return out

    def where(self, mask: list[bool]) -> Rows:
        out = Rows()
        for name in _FIELDS:
            setattr(out, name, list(compress(getattr(self, name), mask)))
        return out

    def _reorder(self, order: list[int]) -> None:
        for name in _FIELDS:
            column = getattr(self, name)
            if column.count(column[0]) < len(column):  # one value throughout stays as it is
                setattr(self, name, list(map(column.__getitem__, order)))


class Column:
    """An incident's facts of one kind and metric: one row per rank, the earliest step of a
    rank kept when it reports again."""

    __slots__ = (
        "_counted", "_first", "_first_counted", "_first_stale", "_min_step", "_moved", "_order",
        "_placed", "_steps", "at", "detail", "kind", "metric", "rank", "raw", "replaced", "step",
        "time", "version", "what",
    )  # fmt: skip

    def __init__(self, kind: str, metric: str) -> None:
        self.kind, self.metric = kind, metric
        self.version = 0  # bumped when a row is added or replaced: what was read of it is stale
        self.replaced = 0  # rows replaced (an earlier step of their rank): rows only added else
        self.at: dict[int, int] = {}  # rank -> row
        self.rank: list[int] = []
        self.step: list[int | None] = []
        self.time: list[float] = []
        self.what: list[str] = []
        self.detail: list[str] = []
        self.raw: list[str] = []
        # Kept as rows come, so that a judgement reads them without a pass over every row: a
        # fault at 100,000 ranks is judged again each time a hundred more of its ranks report.
        # Rows [0, _counted) are in the counts and the lowest step, rows [0, _first_counted) in
        # the first (time, rank); the rows after are taken in when it is read (a burst's rows
        # at once, in C).
        self._counted = self._first_counted = 0
        self._steps: Counter[int | None] = Counter()  # step -> rows at it
        self._min_step: int | None = None  # a row's step only ever moves down
        self._first: tuple[float, int] | None = None  # the least (time, rank)
        self._first_stale = False  # the first row's time moved: found again when read
        self._order: list[tuple[float, int]] = []  # (time, rank) of rows [0, _placed), sorted
        self._placed = 0
        self._moved: dict[int, tuple[float, int]] = {}  # row replaced since -> its key in _order

    def __len__(self) -> int:
        return len(self.rank)

    def add(self, rows: Rows, room: int) -> tuple[int, int]:
        """Add ``rows`` (of this kind and metric), at most ``room`` new ranks; returns (rows
        held anew, rows not held for want of room)."""
        at = self.at
        start = len(self.rank)
        n = min(len(rows), max(room, 0))
        ranks = rows.rank if n == len(rows) else rows.rank[:n]
        at.update(zip(ranks, range(start, start + n), strict=True))
        if len(at) < start + n:  # a rank's evidence again (a verdict and its alert)
            self.at = dict(zip(self.rank, range(start), strict=True))
            return self._add_each(rows, room)
        if n:
            self.version += 1
        for name in ("rank", "step", "time", "what", "detail", "raw"):
            column = getattr(rows, name)
            getattr(self, name).extend(column if n == len(rows) else column[:n])
        return n, len(rows) - n

    def _add_each(self, rows: Rows, room: int) -> tuple[int, int]:
        added = dropped = replaced = 0
        for i, rank in enumerate(rows.rank):
            row = self.at.get(rank)
            step = rows.step[i]
            if row is None:
                if added >= room:
                    dropped += 1
                    continue
                self.at[rank] = len(self.rank)
                self.rank.append(rank)
                for name in ("step", "time", "what", "detail", "raw"):
                    getattr(self, name).append(getattr(rows, name)[i])
                added += 1
            elif step is not None and ((old := self.step[row]) is None or step < old):
                was = (self.time[row], rank)
                if row < self._placed and row not in self._moved:
                    self._moved[row] = was
                for name in ("step", "time", "what", "detail", "raw"):  # the earlier step says more
                    getattr(self, name)[row] = getattr(rows, name)[i]
                self._recount(row, old, step, was, (self.time[row], rank))
                replaced += 1
        if added or replaced:
            self.version += 1
        self.replaced += replaced
        return added, dropped

    def fact(self, row: int) -> Fact:
        values = (self.kind, self.rank[row], self.step[row], self.time[row], self.metric,
                  self.what[row], self.detail[row], self.raw[row])  # fmt: skip
        return _new(Fact, values)

    def get(self, rank: int) -> Fact | None:
        row = self.at.get(rank)
        return None if row is None else self.fact(row)

    def facts(self) -> list[Fact]:
        return list(map(self.fact, range(len(self.rank))))

    def holds(self, fact: Fact) -> bool:
        """Is ``fact`` (made from this column) still what it holds for its rank?"""
        row = self.at.get(fact.rank)
        return row is not None and self.time[row] == fact.time and self.step[row] == fact.step

    def _recount(
        self, row: int, old: int | None, step: int, was: tuple[float, int], now: tuple[float, int]
    ) -> None:
        """Row ``row``'s step moved from ``old`` to ``step``, its key from ``was`` to ``now``."""
        if row < self._counted:
            steps = self._steps
            steps[old] -= 1
            if not steps[old]:
                del steps[old]
            steps[step] += 1
            if self._min_step is None or step < self._min_step:
                self._min_step = step
        if row < self._first_counted:
            if self._first is not None and now < self._first:
                self._first = now
            elif was == self._first and now != was:
                self._first_stale = True

    def _count(self) -> None:
        """Bring the counts and the lowest step up to the rows held."""
        start, n = self._counted, len(self.rank)
        if start < n:
            steps = self.step[start:] if start else self.step
            self._steps.update(steps)
            low = min(known(steps), default=None)
            if low is not None and (self._min_step is None or low < self._min_step):
                self._min_step = low
            self._counted = n

    def _count_first(self) -> None:
        """Bring the first key up to the rows held."""
        start, n = self._first_counted, len(self.rank)
        if start < n and not self._first_stale:
            first = self._first_of(start)
            if self._first is None or first < self._first:
                self._first = first
        self._first_counted = n
        if self._first_stale:
            self._first, self._first_stale = (self._first_of(0) if n else None), False

    def _first_of(self, start: int) -> tuple[float, int]:
        """The least (time, rank) of rows ``start`` on: the least time, then its least rank."""
        times = self.time[start:] if start else self.time
        ranks = self.rank[start:] if start else self.rank
        low = min(times)
        return low, min(map(ranks.__getitem__, positions(times, low)))

    def earliest(self) -> Fact | None:
        """The first by (time, rank)."""
        self._count_first()
        return None if self._first is None else self.get(self._first[1])

    def by_time(self) -> list[tuple[float, int]]:
        """(time, rank) of every row, ascending (the caller does not change it). Kept as rows
        come: the new ones merged in, a moved one taken out and put back."""
        n = len(self.rank)
        if self._placed == n and not self._moved:
            return self._order
        order, time, rank = self._order, self.time, self.rank
        for key in self._moved.values():
            at = bisect_left(order, key)
            if at == len(order) or order[at] != key:  # a time that is not a number: sort anew
                self._order, self._placed, self._moved = [], 0, {}
                return self.by_time()
            del order[at]
        rows = [*self._moved, *range(self._placed, n)]
        new = sorted(zip(map(time.__getitem__, rows), map(rank.__getitem__, rows), strict=True))
        merge_sorted(order, new)
        self._placed, self._moved = n, {}
        return order

    def min_step(self) -> int | None:
        self._count()
        return self._min_step

    def step_counts(self) -> Mapping[int | None, int]:
        """Step -> how many rows hold it (the caller does not change it)."""
        self._count()
        return self._steps

    def steps(self) -> set[int]:
        return set(known(self.step_counts()))

    def ranks_at(self, step: int | None) -> list[int]:
        return list(map(self.rank.__getitem__, self.rows_at(step)))

    def rows_at(self, step: int | None) -> list[int]:
        return positions(self.step, step, self.step_counts().get(step, 0))


def merge_sorted(into: list[_Key], new: list[_Key]) -> None:
    """``new`` (ascending) merged into ``into`` (ascending, changed): most often appended (the
    new are later or higher than the rest), a few put in place, more in one sort of the two
    runs (merged in C)."""
    if not into or (new and new[0] >= into[-1]):
        into += new
    elif len(new) <= _FEW_MOVED:
        for key in new:
            insort(into, key)
    else:
        into += new
        into.sort()


_Key = TypeVar("_Key", int, tuple[float, int])


def by_run(items: list[_Item]) -> list[tuple[str, list[_Item]]]:
    """``items`` by run, each run's in their order; a burst is of one run."""
    if not items:
        return []
    names = set(map(_RUN_OF, items))
    if len(names) == 1:
        return [(names.pop(), items)]
    out: dict[str, list[_Item]] = {}
    for item in items:
        out.setdefault(item.run, []).append(item)
    return list(out.items())


class _OfRun(Protocol):
    @property
    def run(self) -> str: ...


_Item = TypeVar("_Item", bound=_OfRun)
_RUN_OF = attrgetter("run")


def rows_of(facts: dict[str, Rows], run: str) -> Rows:
    """The new rows of ``run`` in ``facts`` (made when it has none yet)."""
    rows = facts.get(run)
    if rows is None:
        rows = facts[run] = Rows()
    return rows
