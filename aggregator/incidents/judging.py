"""Judging an open incident: its evidence through the culprit rules (``rules.judge``) into the
``Incident`` value the tracker hands out, and the transition that makes (opened, updated,
resolved). Also a run's state as the tracker keeps it. Pure: ``now`` is passed in.

A judgement reads what the incident's columns keep as facts arrive (their time order, steps,
the timeline's groups), so judging a fault of 100,000 ranks again after a hundred more of them
reported costs about what those hundred brought, not a pass over every rank's fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from operator import attrgetter, ge

from rankwatch.aggregator.health import RankHealth
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.grouping import Open, forget, is_open
from rankwatch.aggregator.incidents.model import Incident, IncidentChange
from rankwatch.aggregator.incidents.progress import Moves
from rankwatch.aggregator.incidents.stacks import StackGroup, StackSample, group_stacks
from rankwatch.aggregator.incidents.timeline import Lines, timeline

HISTORY_MAX = 256  # closed incidents kept per run, the oldest dropped first

__all__ = ["HISTORY_MAX", "Judge", "Run"]


@dataclass
class Run:
    """One run's incidents and what their judgements read of it."""

    count: int = 0  # incidents numbered
    open: list[Open] = field(default_factory=list)
    history: list[Incident] = field(default_factory=list)
    health: dict[int, RankHealth] = field(default_factory=dict)
    moves: Moves = field(default_factory=Moves)  # the ranks whose ``health`` was replaced
    stacks: dict[int, StackSample] = field(default_factory=dict)
    stacks_version: int = 0  # bumped when ``stacks`` changes
    world: int = 0  # the largest world size its ranks reported

    def take_health(self, ranks: list[int], values: list[RankHealth]) -> None:
        self.health.update(zip(ranks, values, strict=True))
        self.moves.add(ranks, len(self.health))

    def keep(self, done: Incident) -> None:
        self.history.append(done)
        if len(self.history) > HISTORY_MAX:
            del self.history[0]


class Judge:
    """Judges touched incidents: ``window_s`` bounds the stall stacks read (older ones are of
    another stall), ``timeline_max`` and ``early_max`` the timeline."""

    def __init__(self, window_s: float, timeline_max: int, early_max: int) -> None:
        self.window_s, self.timeline_max, self.early_max = window_s, timeline_max, early_max
        self._lines = Lines()  # crash messages' one lines, for the next judgements

    def __call__(self, run: Run, inc: Open, now: float) -> list[IncidentChange]:
        old = inc.value
        if not is_open(inc):
            run.open.remove(inc)
            if old is None:  # evidence that cleared before it was ever judged
                return []
            done = replace(old, state="resolved", resolved=now, updated=now)
            run.keep(done)
            return [IncidentChange("resolved", done, old)]
        verdict = rules.judge(
            inc.evidence,
            run.health,
            lambda: self._groups(run, inc),
            run.world,
            inc.split,
            lambda candidates, health: inc.least(candidates, health, run.moves),
        )
        if inc.verdict is None or inc.verdict.cause != verdict.cause:
            forget(inc)
        inc.verdict = verdict
        value = self._value(inc, verdict, now)
        inc.value = value
        if old is None:
            return [IncidentChange("opened", value)]
        if (old.culprits, old.cause) != (value.culprits, value.cause):
            return [IncidentChange("updated", value, old)]
        return []

    def _groups(self, run: Run, inc: Open) -> list[StackGroup]:
        """The run's stall stacks grouped, from samples of this incident's time (older ones are
        of another stall); kept until a sample arrives or goes."""
        held = inc.groups
        if held is not None and held[0] == run.stacks_version:
            return held[1]
        since = inc.opened - self.window_s
        held_samples = list(run.stacks.values())
        times = list(map(_SAMPLE_TIME, held_samples))
        if min(times, default=since) >= since:  # the common case: every sample of this stall
            groups = group_stacks(held_samples, one_per_rank=True, ranks=list(run.stacks))
        else:
            recent = map(ge, times, repeat(since))
            groups = group_stacks(compress(held_samples, recent), one_per_rank=True)  # by rank
        inc.groups = (run.stacks_version, groups)
        return groups

    def _value(self, inc: Open, v: rules.Verdict, now: float) -> Incident:
        shown = timeline(inc, v, self.timeline_max, self.early_max, self._lines)
        return Incident(
            inc.id, inc.run, v.cause, v.culprits, v.affected, v.terminated, shown,
            inc.opened, now, None, "firing", v.summary, v.basis, v.step, inc.count,
        )  # fmt: skip


_SAMPLE_TIME = attrgetter("time")
