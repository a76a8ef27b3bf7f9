"""An incident's timeline: the culprits' evidence first, then the earliest of the rest, each
with its line for people. Evidence alike but for its rank (the same kind, metric and step, and
the same words where a fact has its own) is one item with a count and the ranks' ranges: a
fault that reaches 4,095 peers is one line, not a page of the same line. Pure.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from itertools import compress, repeat
from operator import eq

from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.columns import Column, merge_sorted
from rankwatch.aggregator.incidents.grouping import GroupKey, Open
from rankwatch.aggregator.incidents.model import RANGES_MAX, Evidence
from rankwatch.aggregator.incidents.rules import Fact

LINES_MAX = 256  # one-line crash messages kept for the next judgements
SPANS_MAX = 256  # groups' ranks kept per incident for the next judgements

__all__ = ["LINES_MAX", "Lines", "add_group_ranks", "early", "group_ranks", "ranges", "timeline"]


class Lines:
    """A crash message's one line, made when a timeline first shows it: each judgement of an
    incident shows the same facts again, and a line costs a parse of the whole message."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}

    def __call__(self, fact: Fact) -> str:
        if fact.what or not fact.raw:
            return fact.line
        line = self._held.get(fact.raw)
        if line is None:
            if len(self._held) >= LINES_MAX:
                self._held.clear()
            line = self._held[fact.raw] = fact.line
        return line


def timeline(
    inc: Open, v: rules.Verdict, limit: int, early_max: int, lines: Lines
) -> tuple[Evidence, ...]:
    shown = [Evidence(f.step, f.time, f.rank, lines(f)) for f in v.own[:limit]]
    if len(shown) >= limit:
        return tuple(shown)
    mine = frozenset(v.culprits[: rules.OWN_RANKS])
    firsts: dict[GroupKey, Fact] = {}  # each group's earliest fact, by time
    for f in early(inc, early_max):
        if f.rank not in mine:
            firsts.setdefault((f.kind, f.metric, f.step, f.what), f)
    # A column whose evidence all came after the earliest facts (the peers' timeouts after
    # every rank's stall) still shows: by its earliest group.
    for kind, columns in inc.evidence.items():
        for metric, column in columns.items():
            if not any(k[0] == kind and k[1] == metric for k in firsts):
                first = _first_not_of(column, mine)
                if first is not None:
                    firsts[(kind, metric, first.step, first.what)] = first
    held = inc.spans
    order = sorted(firsts.items(), key=lambda kv: rules.BY_TIME(kv[1]))
    for key, f in order[: limit - len(shown)]:
        column = inc.evidence[f.kind][f.metric]
        span = held.get(key)
        if span is None or span[0] != column.version or span[1] != mine:
            if span is not None and span[1] == mine and span[5] == column.replaced:
                # rows only added since: the group's ranks among them merged in
                ranks = add_group_ranks(span[2], column, f.step, f.what, mine, span[4])
            else:
                ranks = group_ranks(column, f.step, f.what, mine)
            if len(held) >= SPANS_MAX:
                held.clear()
            span = held[key] = (column.version, mine, ranks, ranges(ranks), len(column),
                                column.replaced)  # fmt: skip
        count, spans = len(span[2]), span[3]
        shown.append(Evidence(f.step, f.time, f.rank, lines(f), count, spans if count > 1 else ()))
    return tuple(shown)


def _first_not_of(column: Column, mine: frozenset[int]) -> Fact | None:
    """The column's first fact by time of a rank not in ``mine``."""
    first = column.earliest()
    if first is None or first.rank not in mine:
        return first
    for _, rank in column.by_time():  # rare: a culprit's column, in its kept time order
        if rank not in mine:
            return column.get(rank)
    return None


def add_group_ranks(
    ranks: list[int],
    column: Column,
    step: int | None,
    what: str,
    mine: frozenset[int],
    start: int,
) -> list[int]:
    """``group_ranks`` of ``column`` when ``ranks`` is it for the rows before ``start`` and no
    row has changed since: those from ``start`` on merged in (``ranks`` is changed and
    returned)."""
    steps, words, of = column.step, column.what, column.rank
    new = sorted(
        of[row]
        for row in range(start, len(column))
        if steps[row] == step and words[row] == what and of[row] not in mine
    )
    merge_sorted(ranks, new)
    return ranks


def group_ranks(column: Column, step: int | None, what: str, mine: frozenset[int]) -> list[int]:
    """The ranks of ``column`` holding evidence at ``step`` with ``what``, less ``mine``,
    ascending. A few passes in C: a group is often the column."""
    n = len(column)
    every = column.step.count(step) == n and column.what.count(what) == n
    if every:
        ranks = sorted(column.rank)
    else:
        rows = list(compress(range(n), map(eq, column.step, repeat(step))))
        if column.what.count(what) < n:
            words = map(column.what.__getitem__, rows)
            rows = list(compress(rows, map(eq, words, repeat(what))))
        ranks = sorted(map(column.rank.__getitem__, rows))
    for r in mine:  # a few: the culprits found in it
        row = column.at.get(r)
        if row is not None and column.step[row] == step and column.what[row] == what:
            del ranks[bisect_left(ranks, r)]
    return ranks


def ranges(ranks: list[int]) -> tuple[tuple[int, int], ...]:
    """Ascending distinct ranks as (first, last) ranges, the first ``RANGES_MAX``. Each run's
    end is found by bisection (``rank - index`` grows at each gap), not rank by rank."""
    out: list[tuple[int, int]] = []
    at, n = 0, len(ranks)
    while at < n and len(out) < RANGES_MAX:
        end = bisect_right(range(n), ranks[at] - at, lo=at, key=lambda i: ranks[i] - i)
        out.append((ranks[at], ranks[end - 1]))
        at = end
    return tuple(out)


def early(inc: Open, early_max: int) -> list[Fact]:
    """The earliest facts held (``grouping.store`` keeps them as they come), by time."""
    evidence = inc.evidence
    held = [f for f in inc.early if evidence[f.kind][f.metric].holds(f)]
    if len(held) < len(inc.early) and inc.count > len(held):  # one was replaced: again
        every = (f for columns in evidence.values() for c in columns.values() for f in c.facts())
        held = inc.early = heapq.nsmallest(early_max, every, key=rules.BY_TIME)
    return held
