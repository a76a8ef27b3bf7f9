"""An incident's ranks as a verdict splits them: affected (went bad after the culprits) and
terminated (only silent or killed after them), kept from one judgement to the next. Pure.

``rules.split_ranks`` is the definition: every column's ranks read again. An incident of
100,000 ranks is judged again each time a hundred more of them report, and its columns only
ever gain ranks: ``RankSplit`` reads the rows added since and moves the ranks they name, and
the culprits added since, and reads everything again only when the culprits changed otherwise
or when much changed at once.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice

from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.columns import merge_sorted

__all__ = ["RankSplit"]

_SILENT = (rules.LOST, rules.KILLED)
_MANY = 8  # more changed ranks than a 1/_MANY of those held: read everything again


class RankSplit:
    def __init__(self) -> None:
        self.bad: set[int] = set()  # ranks with evidence of a kind other than silence
        self.silent: set[int] = set()  # ranks lost or killed
        self._read: dict[tuple[str, str], int] = {}  # (kind, metric) -> its rows read
        self._culprits: tuple[int, ...] | None = None  # as of the last call
        self._mine: set[int] = set()  # the same, as a set
        self.affected: list[int] = []  # sorted(bad - culprits)
        self.terminated: list[int] = []  # sorted(silent - culprits - bad)

    def __call__(
        self, evidence: rules.Evidence, culprits: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``rules.split_ranks(evidence, culprits)``, for the evidence this was last called with
        grown by rows (a row's rank never changes)."""
        old = self._culprits
        if (
            old is None
            or self._new_rows(evidence) * _MANY > len(self.bad) + len(self.silent)
            or (culprits != old and culprits[: len(old)] != old)  # not grown at its end
        ):
            self._take(evidence, False)
            self._mine = set(culprits)
            self.affected = sorted(self.bad - self._mine)
            self.terminated = sorted(self.silent - self._mine - self.bad)
        else:
            new_bad, new_silent = self._take(evidence, True)
            mine = self._mine
            for r in islice(culprits, len(old), None):  # culprits added: no longer the others
                mine.add(r)
                _remove(self.affected, r)
                _remove(self.terminated, r)
            merge_sorted(self.affected, sorted(new_bad - mine))
            for r in new_bad:  # silent before, bad now: affected, not terminated
                if r in self.silent:
                    _remove(self.terminated, r)
            merge_sorted(self.terminated, sorted(new_silent - mine - self.bad))
        self._culprits = culprits
        return tuple(self.affected), tuple(self.terminated)

    def _new_rows(self, evidence: rules.Evidence) -> int:
        read = self._read
        return sum(
            len(column) - read.get((kind, metric), 0)
            for kind, columns in evidence.items()
            for metric, column in columns.items()
        )

    def _take(self, evidence: rules.Evidence, new: bool) -> tuple[set[int], set[int]]:
        """Take in the rows added since; with ``new``, return the ranks they made new to
        ``bad`` and to ``silent`` (else nothing: all is read again)."""
        new_bad: set[int] = set()
        new_silent: set[int] = set()
        read = self._read
        for kind, columns in evidence.items():
            into, fresh = (self.silent, new_silent) if kind in _SILENT else (self.bad, new_bad)
            for metric, column in columns.items():
                start = read.get((kind, metric), 0)
                if start < len(column):
                    ranks = islice(column.rank, start, None) if start else column.rank
                    if new:
                        added = set(ranks) - into
                        into |= added
                        fresh |= added
                    else:
                        into.update(ranks)
                    read[(kind, metric)] = len(column)
        return new_bad, new_silent


def _remove(ranks: list[int], rank: int) -> None:
    at = bisect_left(ranks, rank)
    if at < len(ranks) and ranks[at] == rank:
        del ranks[at]
