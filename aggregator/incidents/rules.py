"""Culprit rules: from one incident's evidence (and the run's ranks and stacks) to its cause,
culprits, affected and terminated ranks and one sentence. Pure; order of arrival does not matter
(the rules sort the evidence themselves), so a late record can change the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents.oneline import one_line
from rankwatch.aggregator.incidents.stacks import (
    StackSample,
    group_stacks,
    odd_ones_out,
    summary_line,
)

# Kinds of evidence (the tracker makes them from verdicts, alerts and health).
NONFINITE, OUTLIER, STRAGGLER = "nonfinite", "outlier", "straggler"
STALLED, LOST, CRASHED, COLLECTIVE, KILLED = "stalled", "lost", "crashed", "collective", "killed"
RANKS_NAMED = 4  # ranks listed by number in a summary before "N ranks"


class Fact(NamedTuple):  # a tuple: a burst makes one per rank
    kind: str
    rank: int
    step: int | None
    time: float
    metric: str  # "" for health facts
    what: str  # the evidence line for people ("" until asked for: see ``line``)
    detail: str = ""  # one-line crash message of a crash that is not a collective failure
    raw: str = ""  # the crash message, made into a line only for the few facts shown

    @property
    def line(self) -> str:
        return self.what or f"crashed: {one_line(self.raw)}"


_BY_TIME = itemgetter(3, 1, 0, 4)  # (time, rank, kind, metric): unique within an incident


@dataclass(frozen=True)
class Verdict:
    cause: str
    culprits: tuple[int, ...]
    affected: tuple[int, ...]
    terminated: tuple[int, ...]
    basis: str
    summary: str
    step: int | None
    facts: list[Fact]  # the evidence by time


def judge(
    facts: Iterable[Fact],
    health: Mapping[int, RankHealth],
    stacks: Mapping[int, StackSample],
) -> Verdict:
    facts = sorted(facts, key=_BY_TIME)
    by_kind: dict[str, list[Fact]] = {}
    for f in facts:
        by_kind.setdefault(f.kind, []).append(f)
    nonfinite = by_kind.get(NONFINITE, [])
    roots = by_kind.get(CRASHED, [])
    if nonfinite and (not roots or nonfinite[0].time <= roots[0].time):
        cause, culprits, basis, step = _nonfinite(nonfinite, health)
    elif roots:
        cause, culprits, basis, step = _crash(roots)
    elif any(k in by_kind for k in (COLLECTIVE, STALLED)):
        cause, culprits, basis, step = _hang(by_kind, health, stacks)
    elif LOST in by_kind or KILLED in by_kind:
        lost = by_kind.get(LOST) or by_kind[KILLED]
        first = lost[0].time
        culprits = _ordered(f for f in lost if f.time - first <= LOST_BURST_S)
        cause, basis, step = "lost", "went silent first", lost[0].step
    elif OUTLIER in by_kind:
        out = sorted(by_kind[OUTLIER], key=lambda f: (f.step or 0, f.time, f.rank))
        cause, basis, step = "divergence", "diverged while the others agreed", out[0].step
        culprits = _ordered(out)
    else:
        slow = by_kind.get(STRAGGLER, [])
        cause, basis = "slow", "slower than the others"
        culprits, step = _ordered(slow), (slow[0].step if slow else None)
    culprit_set = set(culprits)
    ranks_bad = {f.rank for f in facts if f.kind not in (LOST, KILLED)} - culprit_set
    terminated = tuple(sorted({f.rank for f in facts} - culprit_set - ranks_bad))
    affected = tuple(sorted(ranks_bad))
    summary = _summary(cause, culprits, affected, terminated, facts, health, basis, step)
    return Verdict(cause, culprits, affected, terminated, basis, summary, step, facts)


LOST_BURST_S = 10.0  # ranks silent within this of the first are one loss (a switch, a node)


def _ordered(facts: Iterable[Fact]) -> tuple[int, ...]:
    seen: dict[int, None] = {}
    for f in facts:
        seen.setdefault(f.rank, None)
    return tuple(seen)


def _nonfinite(
    facts: list[Fact], health: Mapping[int, RankHealth]
) -> tuple[str, tuple[int, ...], str, int | None]:
    s0 = min(f.step for f in facts if f.step is not None) if _any_step(facts) else None
    at_s0 = [f for f in facts if f.step == s0]
    per_metric: dict[str, list[Fact]] = {}
    for f in at_s0:
        per_metric.setdefault(f.metric, []).append(f)
    # A value taken after the collective (a reduced gradient norm) is non-finite on every rank
    # at the fault step; the metric with the fewest non-finite ranks there names the card.
    metric, chosen = min(per_metric.items(), key=lambda kv: (len({f.rank for f in kv[1]}), kv[0]))
    culprits = _ordered(sorted(chosen, key=lambda f: (f.time, f.rank)))
    world = max((h.world_size for h in health.values()), default=0) or len(health)
    if len(culprits) > 1 and len(culprits) >= world:
        basis = f"every rank non-finite at step {s0} at once ({metric}): no single culprit"
    else:
        basis = f"non-finite first, at step {s0} ({metric})"
    return "nonfinite", culprits, basis, s0


def _any_step(facts: list[Fact]) -> bool:
    return any(f.step is not None for f in facts)


def _crash(roots: list[Fact]) -> tuple[str, tuple[int, ...], str, int | None]:
    first = roots[0]
    # The same error on several ranks is one bug hit everywhere: all are culprits.
    same = [f for f in roots if f.detail == first.detail]
    return "crash", _ordered(same), "crashed first, not in a collective", first.step


def _stop_step(
    culprits: tuple[int, ...], health: Mapping[int, RankHealth], collective: list[Fact]
) -> int | None:
    """The step hung ranks stopped after, when no stall report says it. The health held for a
    rank is that of its last state change, which for a rank still "alive" may be long ago (its
    first sight, before any step). The peers could not finish a step whose collectives it had
    not joined, so it got to at least the step before theirs; an older step is stale, and
    theirs is the better guess."""
    known = min(
        (s for r in culprits if r in health and (s := health[r].last_step) is not None),
        default=None,
    )
    peers = min((f.step for f in collective if f.step is not None), default=None)
    stale = peers is not None and (known is None or known < peers - 1)
    return peers if stale else known


def _hang(
    by_kind: dict[str, list[Fact]],
    health: Mapping[int, RankHealth],
    stacks: Mapping[int, StackSample],
) -> tuple[str, tuple[int, ...], str, int | None]:
    collective = by_kind.get(COLLECTIVE, [])
    stalled = by_kind.get(STALLED, [])
    silent = by_kind.get(LOST, []) + by_kind.get(KILLED, [])
    step = min((f.step for f in stalled if f.step is not None), default=None)
    groups = group_stacks(stacks.values())
    odd = odd_ones_out(groups)
    if odd:
        if step is None:
            step = _stop_step(odd, health, collective)
        return "hang", odd, f"stacks: {summary_line(groups)}", step
    failed = {f.rank for f in collective}
    waited_for = [
        r
        for r, h in health.items()
        if r not in failed and not (h.state is RankState.FINISHED and "normal" in h.message)
    ]
    if failed and waited_for and len(waited_for) <= len(failed):
        culprits = tuple(sorted(waited_for, key=lambda r: _progress_key(r, health)))
        cause, named = "hang", set(culprits)
        first_silence = min((f.time for f in silent if f.rank in named), default=None)
        if step is None:  # no stall seen: the step they stopped after
            step = _stop_step(culprits, health, collective)
        if first_silence is not None and first_silence < collective[0].time:
            cause = "lost"
        return cause, culprits, "its peers failed in collectives waiting for it", step
    if collective and not stalled:
        return (
            "crash",
            (collective[0].rank,),
            "first to fail; every rank failed in a collective",
            (collective[0].step),
        )
    candidates = {f.rank for f in stalled} | {f.rank for f in silent}
    ranked = sorted(candidates, key=lambda r: _progress_key(r, health))
    if not ranked:
        return "hang", (), "no candidate", step
    best = _progress_key(ranked[0], health)
    culprits = tuple(r for r in ranked if _progress_key(r, health)[:2] == best[:2])
    if len(culprits) == len(candidates) and len(culprits) > 1:
        basis = "every rank stopped at the same step at the same time: no stacks to tell them apart"
    else:
        basis = "least progress (no stacks)"
    return "hang", culprits, basis, step


def _progress_key(rank: int, health: Mapping[int, RankHealth]) -> tuple[float, float, int]:
    h = health.get(rank)
    if h is None:
        return (float("inf"), float("inf"), rank)
    step = h.last_step if h.last_step is not None else -1
    return (float(step), h.last_progress, rank)


def _summary(
    cause: str,
    culprits: tuple[int, ...],
    affected: tuple[int, ...],
    terminated: tuple[int, ...],
    facts: list[Fact],
    health: Mapping[int, RankHealth],
    basis: str,
    step: int | None,
) -> str:
    who = _who(culprits, health)
    culprit_set, affected_set = set(culprits), set(affected)
    first = next((f for f in facts if f.rank in culprit_set), None)
    if cause == "nonfinite":
        later = [f.step for f in facts if f.rank in affected_set and f.step is not None]
        head = f"{who} went non-finite first ({first.metric if first else '?'} at step {step})"
        tail = f"; {_count(affected)} followed from step {min(later)}" if later else ""
        if basis.startswith("every rank"):
            head = f"every rank went non-finite at step {step} at once"
    elif cause == "crash":
        head = f"{who} crashed first ({first.detail if first else '?'})"
        tail = f"; {_count(affected)} failed after it" if affected else ""
    elif cause == "hang":
        where = basis.split("; ")[-1] if basis.startswith("stacks") else basis
        head = f"{who} hung" + (f" after step {step}" if step is not None else "") + f" ({where})"
        tail = f"; {_count(affected)} waited or timed out after it" if affected else ""
    elif cause == "lost":
        head = f"{who} went silent first"
        tail = f"; {_count(affected)} failed after it" if affected else ""
    elif cause == "divergence":
        head = f"{who} diverged ({first.line if first else '?'}) from step {step}"
        tail = ""
    else:
        head, tail = f"{who} is slower than the others from step {step}", ""
    if terminated:
        tail += f"; {_count(terminated)} terminated by the launcher"
    return head + tail


def _who(ranks: tuple[int, ...], health: Mapping[int, RankHealth]) -> str:
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        h = health.get(ranks[0])
        where = f" ({h.host}, pid {h.pid})" if h is not None and h.host else ""
        return f"rank {ranks[0]}{where}"
    if len(ranks) <= RANKS_NAMED:
        return "ranks " + ", ".join(map(str, ranks))
    return f"{len(ranks)} ranks"


def _count(ranks: tuple[int, ...]) -> str:
    if len(ranks) <= RANKS_NAMED:
        word = "rank" if len(ranks) == 1 else "ranks"
        return f"{len(ranks)} {word} ({', '.join(map(str, ranks))})"
    return f"{len(ranks)} ranks"
