"""Evidence column by column: a burst of new facts (``Rows``) and an incident's facts of one
kind and metric (``Column``). Pure.

A fault at 4,096 ranks arrives as thousands of facts alike but for their rank. Held as one
tuple per fact, building, keying and scanning them is most of what a burst costs; held as
columns (a list of ranks, of steps, of times ...) they are added and read with ``map``,
``zip`` and ``compress`` in C, and a ``Fact`` is made only for the few a person sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress, islice, repeat
from operator import attrgetter, eq, le
from typing import Protocol, TypeVar

from rankwatch.aggregator.incidents.rules import Fact, known

__all__ = ["Column", "Rows", "by_run", "rows_of"]

_new = tuple.__new__
_FIELDS = ("kind", "rank", "step", "time", "metric", "what", "detail", "raw")  # Fact's order
Text = str | Iterable[str]  # one text for every row, or one per row


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
        if times.count(times[0]) == len(times):  # one time throughout: by rank alone
            if all(map(le, ranks, islice(ranks, 1, None))):
                return
        elif all(map(le, times, islice(times, 1, None))):
            by_rank = map(le, ranks, islice(ranks, 1, None))
            if all(compress(by_rank, map(eq, times, islice(times, 1, None)))):
                return  # already in order: the common burst
        order = sorted(range(len(ranks)), key=ranks.__getitem__)
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

    __slots__ = ("at", "detail", "kind", "metric", "rank", "raw", "step", "time", "what")

    def __init__(self, kind: str, metric: str) -> None:
        self.kind, self.metric = kind, metric
        self.at: dict[int, int] = {}  # rank -> row
        self.rank: list[int] = []
        self.step: list[int | None] = []
        self.time: list[float] = []
        self.what: list[str] = []
        self.detail: list[str] = []
        self.raw: list[str] = []

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
        for name in ("rank", "step", "time", "what", "detail", "raw"):
            column = getattr(rows, name)
            getattr(self, name).extend(column if n == len(rows) else column[:n])
        return n, len(rows) - n

    def _add_each(self, rows: Rows, room: int) -> tuple[int, int]:
        added = dropped = 0
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
                for name in ("step", "time", "what", "detail", "raw"):  # the earlier step says more
                    getattr(self, name)[row] = getattr(rows, name)[i]
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

    def earliest(self) -> Fact | None:
        """The first by (time, rank)."""
        if not self.rank:
            return None
        first = min(self.time)
        rows = list(compress(range(len(self.rank)), map(eq, self.time, repeat(first))))
        return self.fact(min(rows, key=self.rank.__getitem__))

    def min_step(self) -> int | None:
        return min(known(self.step), default=None)

    def steps(self) -> set[int]:
        return set(known(self.step))

    def ranks_at(self, step: int | None) -> list[int]:
        return list(compress(self.rank, map(eq, self.step, repeat(step))))

    def rows_at(self, step: int | None) -> list[int]:
        return list(compress(range(len(self.rank)), map(eq, self.step, repeat(step))))


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
