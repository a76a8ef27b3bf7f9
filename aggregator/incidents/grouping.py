"""An open incident's state, and which incident evidence belongs to: whether an incident
explains a fact of a rank not yet in it (``explains``), whether the rest of a burst can go to it
at once (``all_explained``), adding evidence (``store``), evidence that is over (``recover``).
Pure; the tracker routes with these (see docs/incidents.md, "Which incident evidence belongs
to").
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import eq
from typing import cast

from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.columns import Column, Rows
from rankwatch.aggregator.incidents.model import Incident
from rankwatch.aggregator.incidents.progress import KeptLeast
from rankwatch.aggregator.incidents.rules import Fact, known
from rankwatch.aggregator.incidents.split import RankSplit
from rankwatch.aggregator.incidents.stacks import StackGroup

__all__ = [
    "GroupKey", "Open", "Span", "all_explained", "explains", "forget", "is_open", "members_only",
    "recover", "store",
]  # fmt: skip


# A timeline group: (kind, metric, step, what); what is "" where a fact's line is made from
# the rest. Its span: (column version, culprits left out, its ranks ascending, their ranges,
# the column's rows and replacements when read), kept while the column and the culprits stay
# as they were, and brought up to date by the rows added since while no row was replaced.
GroupKey = tuple[str, str, int | None, str]
Span = tuple[int, frozenset[int], list[int], tuple[tuple[int, int], ...], int, int]


@dataclass
class Open:
    id: str
    run: str
    opened: float
    # kind -> metric -> its facts, one row per rank: what the rules read (rules.Evidence)
    evidence: dict[str, dict[str, Column]] = field(default_factory=dict)
    count: int = 0  # facts held
    members: set[int] = field(default_factory=set)  # ranks with evidence in it
    # (kind, metric) -> ranks whose fact of it is over (a subset of its column's): the rest
    # fire. Kept as what is over, not what fires: a burst adds no rank to it.
    over: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    last: float = 0.0  # time of the latest evidence
    first: Fact | None = None  # the earliest evidence
    first_time: float = math.inf  # its time
    first_step: int | None = None  # the earliest non-finite step
    crash_lines: set[str] = field(default_factory=set)  # one-line messages of its crashes
    # Whether it explains a fact of a rank not yet in it, by the fact's class (kind, and step
    # for non-finite): a burst asks once per class, not once per rank. Cleared when what
    # ``explains`` reads changes (its first fact, first step, kinds, crashes, verdict).
    memo: dict[object, bool] = field(default_factory=dict)
    epoch: int = 0  # bumped when ``memo`` is cleared
    groups: tuple[int, list[StackGroup]] | None = None  # (stacks version, groups) last used
    early: list[Fact] = field(default_factory=list)  # the earliest facts, by time (bounded)
    spans: dict[GroupKey, Span] = field(default_factory=dict)  # the timeline's groups, as read
    value: Incident | None = None  # as last announced
    verdict: rules.Verdict | None = None
    split: RankSplit = field(default_factory=RankSplit)  # its affected and terminated, kept
    least: KeptLeast = field(default_factory=KeptLeast)  # its least-progress ranks, kept


def explains(inc: Open, fact: Fact, spread_steps: int) -> bool:
    """Does ``inc`` explain a fact of a rank not yet in it (its time within the window)?"""
    cause = inc.verdict.cause if inc.verdict is not None else first_cause(inc)
    if fact.kind == rules.NONFINITE:
        first = inc.first_step
        return (
            cause == "nonfinite"
            and fact.step is not None
            and (first is None or fact.step <= first + spread_steps)
        )
    if fact.kind == rules.COLLECTIVE:
        return cause not in ("divergence",)
    if fact.kind == rules.CRASHED:
        # Peers that failed in a collective were waiting for someone: a crash that is not a
        # collective failure is who they waited for, whichever arrived first.
        # So is a crash that precedes the losses and kills that opened an incident.
        kinds = set(inc.evidence)
        waiting = (
            not inc.crash_lines
            and kinds <= _CONSEQUENCES
            and (rules.COLLECTIVE in kinds or inc.first is None or fact.time <= inc.first.time)
        )
        return fact.detail in inc.crash_lines or waiting
    if fact.kind in (rules.LOST, rules.KILLED):
        if cause == "lost":
            return abs(fact.time - inc.opened) <= rules.LOST_BURST_S
        return cause in ("crash", "hang", "nonfinite")
    if fact.kind == rules.STALLED:
        return cause in ("crash", "hang", "lost", "slow")
    return False


def is_open(inc: Open) -> bool:
    """Is any of its evidence not yet over?"""
    over = inc.over
    return any(
        len(column) > len(over.get((kind, metric), _NONE))
        for kind, columns in inc.evidence.items()
        for metric, column in columns.items()
    )


def all_explained(inc: Open, rows: Rows, start: int, window: float, spread_steps: int) -> bool:
    """Would each of ``rows`` from ``start`` on (in time order, after a fact of theirs just
    went to ``inc``, the newest incident) go to ``inc`` one by one, and leave what ``explains``
    reads as it is? Then they go at once. One kind, explained by its class, within the window."""
    kinds = set(rows.kind[start:])
    if len(kinds) != 1:
        return False
    (kind,) = kinds
    if kind in TIMED_KINDS or kind not in inc.evidence:
        return False
    if rows.time[-1] - inc.last > window or inc.opened - rows.time[start] > window:
        return False
    if kind != _NONFINITE:
        hit = inc.memo.get(kind)
        if hit is None:  # by its class alone: the same for every fact of the kind
            hit = inc.memo[kind] = explains(inc, rows.fact(start), spread_steps)
        return hit
    # Each is explained in any order when every step is within spread_steps of the lowest
    # first step the incident can have meanwhile; that is then its first step.
    held = set(rows.step[start:])
    cause = inc.verdict.cause if inc.verdict is not None else first_cause(inc)
    if None in held or cause != "nonfinite" or inc.first_step is None:
        return False
    steps = cast("set[int]", held)
    low = min(inc.first_step, *steps)
    if max(steps) > low + spread_steps:
        return False
    if low != inc.first_step:
        inc.first_step = low
        forget(inc)
    return True


def members_only(inc: Open, rows: Rows, start: int, window: float) -> bool:
    """Are ``rows`` from ``start`` on (in time order) all of ranks already in ``inc``, the
    newest incident, of one kind, within its window, none earlier than its first evidence and
    none changing what ``explains`` reads? Then they go to it at once, as one by one."""
    kinds = set(rows.kind[start:])
    if len(kinds) != 1 or not inc.members.issuperset(rows.rank[start:]):
        return False
    (kind,) = kinds
    times = rows.time
    if times[-1] - inc.last > window or inc.opened - times[start] > window:
        return False
    if times[start] < inc.first_time:
        return False
    if kind == _NONFINITE:
        steps = set(rows.step[start:])
        first = inc.first_step
        return None not in steps and first is not None and min(known(steps)) >= first
    return kind != _CRASHED or inc.crash_lines.issuperset(rows.detail[start:])


def store(inc: Open, kind: str, rows: Rows, limit: int, early_max: int) -> int:
    """Add facts of one kind to ``inc``, at most ``limit`` facts held in all; returns how
    many were not held."""
    dropped = 0
    columns = inc.evidence[kind]
    metrics = set(rows.metric)
    parts = [(metrics.pop(), rows)] if len(metrics) == 1 else [
        (m, rows.where(list(map(eq, rows.metric, repeat(m))))) for m in sorted(metrics)
    ]  # fmt: skip
    for metric, part in parts:
        column = columns.get(metric)
        if column is None:
            column = columns[metric] = Column(kind, metric)
        added, lost = column.add(part, limit - inc.count)
        inc.count += added
        dropped += lost
        ended = inc.over.get((kind, metric))
        if ended:  # their evidence again: firing again
            ended.difference_update(part.rank)
    # ``rows`` are in time order: only their head can be among the earliest
    head = rows.take(list(range(min(len(rows), early_max)))).facts()
    inc.early = heapq.nsmallest(early_max, chain(inc.early, head), key=rules.BY_TIME)
    return dropped


_CONSEQUENCES = {rules.COLLECTIVE, rules.LOST, rules.KILLED, rules.STALLED}
TIMED_KINDS = {rules.CRASHED, rules.LOST, rules.KILLED}  # ``explains`` reads their time
RECOVERED = (RankState.ALIVE, RankState.PAUSED, RankState.FINISHED)
_NONFINITE, _CRASHED = rules.NONFINITE, rules.CRASHED


def forget(inc: Open) -> None:
    inc.memo.clear()
    inc.epoch += 1


def first_cause(inc: Open) -> str:
    """The cause as the earliest evidence says, before the incident is first judged."""
    return _CAUSE_OF_KIND[inc.first.kind] if inc.first is not None else ""


_CAUSE_OF_KIND = {
    rules.NONFINITE: "nonfinite", rules.OUTLIER: "divergence", rules.STRAGGLER: "slow",
    rules.CRASHED: "crash", rules.COLLECTIVE: "crash", rules.STALLED: "hang",
    rules.LOST: "lost", rules.KILLED: "lost",
}  # fmt: skip


def recover(inc: Open, rank: int, key: tuple[str, str] | None) -> bool:
    if rank not in inc.members:
        return False
    changed = False
    # alive again: every health fact of the rank is over
    for k in _HEALTH_KEYS if key is None else (key,):
        column = inc.evidence.get(k[0], _NO_COLUMNS).get(k[1])
        if column is not None and rank in column.at:
            ended = inc.over.setdefault(k, set())
            if rank not in ended:
                ended.add(rank)
                changed = True
    return changed


_HEALTH_KINDS = (rules.STALLED, rules.LOST, rules.CRASHED, rules.COLLECTIVE, rules.KILLED)
_HEALTH_KEYS = tuple((kind, "") for kind in _HEALTH_KINDS)
_NONE: set[int] = set()
_NO_COLUMNS: dict[str, Column] = {}
