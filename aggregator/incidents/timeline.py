"""An incident's timeline: the culprits' evidence first, then the earliest of the rest, each
with its line for people. Pure."""

from __future__ import annotations

import heapq

from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.grouping import Open
from rankwatch.aggregator.incidents.model import Evidence
from rankwatch.aggregator.incidents.rules import Fact

LINES_MAX = 256  # one-line crash messages kept for the next judgements

__all__ = ["LINES_MAX", "Lines", "early", "timeline"]


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
    shown = v.own[:limit]
    if len(shown) < limit:
        mine = set(v.culprits[: rules.OWN_RANKS])
        rest = [f for f in early(inc, early_max) if f.rank not in mine]
        shown = shown + rest[: limit - len(shown)]
    return tuple(Evidence(f.step, f.time, f.rank, lines(f)) for f in shown)


def early(inc: Open, early_max: int) -> list[Fact]:
    """The earliest facts held (``grouping.store`` keeps them as they come), by time."""
    evidence = inc.evidence
    held = [f for f in inc.early if evidence[f.kind][f.metric].holds(f)]
    if len(held) < len(inc.early) and inc.count > len(held):  # one was replaced: again
        every = (f for columns in evidence.values() for c in columns.values() for f in c.facts())
        held = inc.early = heapq.nsmallest(early_max, every, key=rules.BY_TIME)
    return held
