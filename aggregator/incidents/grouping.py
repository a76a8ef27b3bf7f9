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
from operator import itemgetter

from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.model import Incident
from rankwatch.aggregator.incidents.rules import Fact
from rankwatch.aggregator.incidents.stacks import StackGroup

__all__ = ["Open", "all_explained", "explains", "forget", "recover", "store"]


@dataclass
class Open:
    id: str
    run: str
    opened: float
    # kind -> (rank, metric) -> fact: what the rules read, a pass per kind (rules.Evidence)
    evidence: dict[str, dict[tuple[int, str], Fact]] = field(default_factory=dict)
    count: int = 0  # facts held
    members: set[int] = field(default_factory=set)  # ranks with evidence in it
    open_keys: set[tuple[int, str, str]] = field(default_factory=set)  # facts not yet over
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
    value: Incident | None = None  # as last announced
    verdict: rules.Verdict | None = None


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


def all_explained(inc: Open, rest: list[Fact], window: float, spread_steps: int) -> bool:
    """Would each of ``rest`` (in time order, after a fact of theirs just went to ``inc``,
    the newest incident) go to ``inc`` one by one, and leave what ``explains`` reads as it
    is? Then they go at once. One kind, explained by its class, within the window."""
    kinds = set(map(_FACT_KIND, rest))
    if len(kinds) != 1:
        return False
    (kind,) = kinds
    if kind in TIMED_KINDS or kind not in inc.evidence:
        return False
    if rest[-1][3] - inc.last > window or inc.opened - rest[0][3] > window:
        return False
    if kind != _NONFINITE:
        hit = inc.memo.get(kind)
        if hit is None:  # by its class alone: the same for every fact of the kind
            hit = inc.memo[kind] = explains(inc, rest[0], spread_steps)
        return hit
    # Each is explained in any order when every step is within spread_steps of the lowest
    # first step the incident can have meanwhile; that is then its first step.
    steps = set(map(_FACT_STEP, rest))
    cause = inc.verdict.cause if inc.verdict is not None else first_cause(inc)
    if None in steps or cause != "nonfinite" or inc.first_step is None:
        return False
    low = min(inc.first_step, *steps)
    if max(steps) > low + spread_steps:
        return False
    if low != inc.first_step:
        inc.first_step = low
        forget(inc)
    return True


def store(inc: Open, kind: str, batch: list[Fact], limit: int, early_max: int) -> int:
    """Add a batch of one kind to ``inc``, at most ``limit`` facts held in all; returns how
    many were not held."""
    dropped = 0
    facts_of = inc.evidence[kind]
    keys = list(zip(map(_FACT_RANK, batch), map(_FACT_METRIC, batch), strict=True))
    fresh = dict(zip(keys, batch, strict=True))
    if len(fresh) == len(keys) and facts_of.keys().isdisjoint(keys):
        room = limit - inc.count
        if len(keys) > room:
            dropped += len(keys) - room
            fresh = dict(zip(keys[:room], batch[:room], strict=True))
        facts_of.update(fresh)
        inc.count += len(fresh)
    else:  # a rank's evidence again (a verdict and its alert): one at a time
        for key, fact in zip(keys, batch, strict=True):
            old = facts_of.get(key)
            if old is None:
                if inc.count >= limit:
                    dropped += 1
                    continue
                facts_of[key] = fact
                inc.count += 1
            elif fact.step is not None and (old.step is None or fact.step < old.step):
                facts_of[key] = fact  # the earlier step says more
    inc.open_keys.update(zip(map(_FACT_RANK, batch), repeat(kind), map(_FACT_METRIC, batch)))
    # ``batch`` is in time order: only its head can be among the earliest
    head = batch[:early_max]
    inc.early = heapq.nsmallest(early_max, chain(inc.early, head), key=rules.BY_TIME)
    return dropped


_CONSEQUENCES = {rules.COLLECTIVE, rules.LOST, rules.KILLED, rules.STALLED}
TIMED_KINDS = {rules.CRASHED, rules.LOST, rules.KILLED}  # ``explains`` reads their time
RECOVERED = (RankState.ALIVE, RankState.PAUSED, RankState.FINISHED)
_FACT_KIND, _FACT_RANK, _FACT_STEP, _FACT_METRIC = (
    itemgetter(0),
    itemgetter(1),
    itemgetter(2),
    itemgetter(4),
)
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
    before = len(inc.open_keys)
    if key is None:  # alive again: every health fact of the rank is over
        inc.open_keys.difference_update((rank, kind, "") for kind in _HEALTH_KINDS)
    else:
        inc.open_keys.discard((rank, *key))
    return len(inc.open_keys) != before


_HEALTH_KINDS = (rules.STALLED, rules.LOST, rules.CRASHED, rules.COLLECTIVE, rules.KILLED)
