"""Incidents: the alerts and rank-state changes of one fault, grouped, with a culprit.

Pure: ``now`` is passed in. ``IncidentTracker.observe`` takes what the aggregator already has
(divergence verdicts, alert transitions, rank-health transitions, stack samples) and returns
incident transitions: ``opened``, ``updated`` (culprits or cause changed), ``resolved``.

Evidence joins an open incident of its run when the incident explains it (see ``_explains``):
the rank is already part of it, it is non-finite within ``spread_steps`` of the first non-finite
step, it is a collective failure, a stall or a kill after a fault. Anything else opens a second
incident. Each touched incident is judged again (``judging.Judge``), once per ``observe``
call: call it once per loop pass with everything new, not once per record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import cast

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import HealthChanges, RankHealth
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.columns import Column, Rows, by_run, rows_of
from rankwatch.aggregator.incidents.facts import (
    alert_items,
    alert_kind,
    divergence_facts,
    divergence_kind,
    health_columns,
    health_facts,
)
from rankwatch.aggregator.incidents.grouping import (
    TIMED_KINDS,
    Open,
    all_explained,
    explains,
    forget,
    members_only,
    recover,
    store,
)
from rankwatch.aggregator.incidents.judging import HISTORY_MAX, Judge, Run
from rankwatch.aggregator.incidents.model import Incident, IncidentChange
from rankwatch.aggregator.incidents.rules import Fact
from rankwatch.aggregator.incidents.stacks import StackSample

DEFAULT_WINDOW_S = 120.0  # evidence this long after an incident's last is a new fault
DEFAULT_SPREAD_STEPS = 1  # non-finite this many steps after the first is propagation
TIMELINE_MAX = 64  # evidence items an Incident value carries (all are kept inside)
OPEN_MAX = 64  # open incidents per run; past it the oldest is closed as it stands
EVIDENCE_MAX = 65_536  # evidence items held per incident (4,096 ranks x 16 metrics)
BULK_MIN = 32  # facts left in a burst worth checking whether all go where the last went (in C)
HealthInput = RankHealth | tuple[RankHealth, str]
# A new incident is announced (console, webhooks) once its culprits and cause held this long,
# at the latest this long after it opened (aggregator/hold.py); the API has it at once.
DEFAULT_ANNOUNCE_QUIET_S = 1.0
DEFAULT_ANNOUNCE_HOLD_S = 1.5

__all__ = ["EVIDENCE_MAX", "HISTORY_MAX", "IncidentConfig", "IncidentTracker"]


@dataclass(frozen=True)
class IncidentConfig:
    window_s: float = DEFAULT_WINDOW_S
    spread_steps: int = DEFAULT_SPREAD_STEPS
    timeline_max: int = TIMELINE_MAX
    announce_quiet_s: float = DEFAULT_ANNOUNCE_QUIET_S
    announce_hold_s: float = DEFAULT_ANNOUNCE_HOLD_S

    def __post_init__(self) -> None:
        for key in ("announce_quiet_s", "announce_hold_s"):
            value = getattr(self, key)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"incidents.{key} must be a number of seconds >= 0, got {value!r}")
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"incidents.window_s must be a positive number, got {self.window_s!r}")
        if self.spread_steps < 0:
            raise ValueError(f"incidents.spread_steps must be >= 0, got {self.spread_steps!r}")
        if self.timeline_max < 1:
            raise ValueError(f"incidents.timeline_max must be >= 1, got {self.timeline_max!r}")


class IncidentTracker:
    def __init__(
        self, config: IncidentConfig | None = None, numbered: Callable[[str], int] | None = None
    ) -> None:
        """``numbered(run)``: how many incidents of ``run`` were numbered before this tracker
        (an earlier `serve` on the same store), so that a new one does not take an old id."""
        self.config = config or IncidentConfig()
        self._numbered = numbered
        self._runs: dict[str, Run] = {}
        self.refused_stacks = 0  # samples for a rank the run has never reported
        self.evicted = 0  # open incidents closed unresolved to stay within OPEN_MAX
        self.dropped_evidence = 0  # evidence not held past EVIDENCE_MAX (still routed)
        # early facts kept per incident: enough to fill a timeline besides the culprits' own
        self._early_max = 2 * self.config.timeline_max
        self._judge = Judge(self.config.window_s, self.config.timeline_max, self._early_max)

    def observe(
        self,
        now: float,
        *,
        divergences: Iterable[Divergence] = (),
        resolved: Iterable[Divergence] = (),
        alerts: Iterable[Alert] = (),
        health: Iterable[HealthInput] = (),
        stacks: Iterable[StackSample] = (),
        times: Mapping[tuple[str, int, int], float] | None = None,
    ) -> list[IncidentChange]:
        """Everything new since the last call -> incident transitions.

        ``times``: (run, rank, step) -> record time, to order divergences of the same step
        (without it, ``now`` is their time). ``health``: ``HealthTracker.changes()`` (its
        ranks and states read as columns when it is of one run), its items, or bare
        ``RankHealth`` values.
        """
        facts: dict[str, Rows] = {}  # per run
        recoveries: list[tuple[str, int, tuple[str, str] | None]] = []
        # A burst is handled column by column (attributes, facts, dict and set updates in C):
        # at 4,096 ranks a Python statement per event is most of the cost.
        for name, rest in self._health_facts(health, facts):
            # the rest are ranks well again (RECOVERED): their stalls are over
            recoveries += zip(repeat(name), map(_RANK, rest), repeat(None))
            run = self._run(name)
            if run.stacks and rest:
                gone = [r for r in map(_RANK, rest) if run.stacks.pop(r, None) is not None]
                run.stacks_version += bool(gone)  # where they were no longer matters
        for name, verdicts in by_run(list(divergences)):
            divergence_facts(verdicts, name, now, times, rows_of(facts, name))
        for d in resolved:
            recoveries.append((d.run, d.rank, (divergence_kind(d.kind, d.metric), d.metric)))
        self._take_alerts(alerts, facts, recoveries)
        touched: dict[int, tuple[Run, Open]] = {}
        for name, samples in by_run(list(stacks)):
            of = self._runs.get(name)
            ranks = list(map(_RANK, samples))
            if of is not None and not of.health.keys() >= set(ranks):
                samples = [s for s in samples if s.rank in of.health]
                self.refused_stacks += len(ranks) - len(samples)
                ranks = list(map(_RANK, samples))
            if of is None or not samples:
                self.refused_stacks += len(ranks)
                continue
            of.stacks.update(zip(ranks, samples, strict=True))
            of.stacks_version += 1
            for inc in of.open:
                if not inc.members.isdisjoint(ranks):
                    touched[id(inc)] = (of, inc)
        for run_name, rows in facts.items():
            if len(rows):
                self._place(self._run(run_name), run_name, rows, touched)
        for run_name, rank, key in recoveries:
            of = self._runs.get(run_name)
            if of is None:
                continue
            for inc in of.open:
                if recover(inc, rank, key):
                    touched[id(inc)] = (of, inc)
        changes: list[IncidentChange] = []
        for run, inc in touched.values():
            changes.extend(self._judge(run, inc, now))
        return changes

    def _health_facts(
        self, health: Iterable[HealthInput], facts: dict[str, Rows]
    ) -> list[tuple[str, list[RankHealth]]]:
        """Take in a burst of health values: per run, the values that made no fact.
        ``HealthChanges`` of one run gives its ranks and states as columns."""
        if isinstance(health, HealthChanges) and len(health.runs) == 1 and health.in_step():
            name, ranks = health.runs[0], health.ranks
            hs = list(map(_FIRST, health))
            run = self._run(name)
            run.take_health(ranks, hs)
            run.world = max(run.world, max(map(_WORLD, hs)))
            rest = health_columns(hs, rows_of(facts, name), ranks, health.states)
            return [(name, rest)]
        given = list(health)
        types = set(map(type, given))
        if types <= {tuple, HealthChanges}:  # HealthTracker.changes(): (health, old state)
            hs = list(map(_FIRST, cast("list[tuple[RankHealth, str]]", given)))
        elif any(issubclass(t, tuple) for t in types):
            hs = [h[0] if isinstance(h, tuple) else h for h in given]
        else:
            hs = cast("list[RankHealth]", given)
        out = []
        for name, part in by_run(hs):
            run = self._run(name)
            ranks = list(map(_RANK, part))
            run.take_health(ranks, part)
            run.world = max(run.world, max(map(_WORLD, part)))
            out.append((name, health_facts(part, rows_of(facts, name), ranks)))
        return out

    def _take_alerts(
        self,
        alerts: Iterable[Alert],
        facts: dict[str, Rows],
        recoveries: list[tuple[str, int, tuple[str, str] | None]],
    ) -> None:
        # A grouped alert's since_step is its earliest rank's: given to a rank that has its own
        # verdict it would move that rank back to the culprit's step. So it speaks only for the
        # ranks of the group that have no verdict of their own (this call or an open incident).
        own: set[tuple[str, int, str, str]] | None = None
        for a in alerts:
            ranks = None
            kind = alert_kind(a)
            if a.rank is None and len(a.ranks) > 1 and a.state != "resolved" and kind:
                if own is None:
                    own = {
                        key
                        for r, rows in facts.items()
                        for key in zip(repeat(r), rows.rank, rows.kind, rows.metric)
                    }
                # before a fact is made of each: in a cascade every rank has its own verdict
                ranks = self._without_own(own, a.run, kind, str(a.metric), a.ranks)
            for run_name, fact, recovery in alert_items(a, ranks):
                if fact is not None:
                    rows_of(facts, run_name).add(fact)
                if recovery is not None:
                    recoveries.append((run_name, recovery[0], recovery[1]))

    def _place(self, run: Run, name: str, rows: Rows, touched: dict[int, tuple[Run, Open]]) -> None:
        """Route a run's new facts, causes before effects, and add each to its incident."""
        rows.sort()
        window = self.config.window_s
        newest = run.open[-1] if run.open else None
        inc: Open | None = None
        kind = ""
        batch: list[int] = []
        members: set[int] = set()
        # Each fact is routed in time order, its rank made a member at once (later facts of it
        # follow it there); the facts are stored per (incident, kind) in bulk afterwards.
        batches: dict[tuple[int, str], tuple[Open, str, list[int]]] = {}
        tried: tuple[int, int] | None = None
        bulk = tried_members = False
        kinds, ranks, steps, times = rows.kind, rows.rank, rows.step, rows.time
        n = len(rows)
        for i in range(n):
            rank, t, fkind = ranks[i], times[i], kinds[i]
            # The common cases of a burst first, as ``_route`` would decide them for the newest
            # incident: a rank already part of it, or a fact of a class it explains.
            if (
                newest is not None
                and t - newest.last <= window
                and newest.opened - t <= window
                and rank in newest.members
            ):
                to = newest
                # The rest of the burst of ranks already in it, maybe (peers timing out after
                # their stall): asked once.
                if not tried_members and n - i > BULK_MIN:
                    bulk = tried_members = True
            else:
                if (
                    newest is not None
                    and t - newest.last <= window
                    and newest.opened - t <= window
                    and newest.memo.get((fkind, steps[i]) if fkind == _NONFINITE else fkind)
                ):
                    to = newest
                else:
                    to = self._route(run, name, rows.fact(i))
                    newest = run.open[-1]
                # Explained by its class: maybe the rest of the burst is too. Asked again only
                # when what the answer depends on has changed.
                if to is newest and tried != (id(to), to.epoch) and n - i > BULK_MIN:
                    bulk = True
            if to is not inc or fkind != kind:
                inc, kind = to, fkind
                batch, members = self._batch(run, inc, kind, batches, touched), inc.members
            batch.append(i)
            members.add(rank)
            if t > inc.last:
                inc.last = t
            if t < inc.first_time:
                inc.first, inc.first_time = rows.fact(i), t
                forget(inc)
            if kind == _NONFINITE:
                step = steps[i]
                if step is not None and (inc.first_step is None or step < inc.first_step):
                    inc.first_step = step
                    forget(inc)
            elif kind == _CRASHED and rows.detail[i] not in inc.crash_lines:
                inc.crash_lines.add(rows.detail[i])
                forget(inc)
            if bulk:
                bulk, tried = False, (id(inc), inc.epoch)
                if inc is newest and (
                    (all_members := members_only(inc, rows, i + 1, window))
                    or all_explained(inc, rows, i + 1, window, self.config.spread_steps)
                ):
                    # the rest is of one kind, not always the kind of this fact
                    rest = self._batch(run, inc, kinds[i + 1], batches, touched)
                    rest += range(i + 1, n)
                    # not all of them in it yet (``members_only`` has asked already)
                    if not all_members and not members.issuperset(ranks[i + 1 :]):
                        members.update(ranks[i + 1 :])
                    inc.last = max(inc.last, times[-1])
                    break
        for inc, kind, at in batches.values():
            self.dropped_evidence += store(inc, kind, rows.take(at), EVIDENCE_MAX, self._early_max)

    @staticmethod
    def _batch(
        run: Run,
        inc: Open,
        kind: str,
        batches: dict[tuple[int, str], tuple[Open, str, list[int]]],
        touched: dict[int, tuple[Run, Open]],
    ) -> list[int]:
        """The rows of a burst going to ``inc`` as ``kind``."""
        held = batches.get((id(inc), kind))
        if held is None:
            held = batches[(id(inc), kind)] = (inc, kind, [])
            touched[id(inc)] = (run, inc)
            if kind not in inc.evidence:
                inc.evidence[kind] = {}
                forget(inc)
        return held[2]

    def _without_own(
        self,
        own: set[tuple[str, int, str, str]],
        run_name: str,
        kind: str,
        metric: str,
        ranks: Sequence[int],
    ) -> list[int]:
        """The ``ranks`` with no verdict of their own of ``kind`` on ``metric``: neither in
        this call's facts (``own``) nor in an open incident's evidence."""
        run = self._runs.get(run_name)
        held = [] if run is None else [
            column.at for inc in run.open
            if (column := inc.evidence.get(kind, _EMPTY).get(metric)) is not None
        ]  # fmt: skip
        return [
            rank for rank in ranks
            if (run_name, rank, kind, metric) not in own and not any(rank in at for at in held)
        ]  # fmt: skip

    def incidents(self, run: str) -> list[Incident]:
        """Every announced incident of ``run``, oldest first (open ones as last judged)."""
        r = self._runs.get(run)
        if r is None:
            return []
        live = [inc.value for inc in r.open if inc.value is not None]
        return sorted(r.history + live, key=lambda i: (i.opened, i.id))

    def open_count(self, run: str) -> int:
        r = self._runs.get(run)
        return sum(1 for inc in r.open if inc.value is not None) if r is not None else 0

    def stacks(self, run: str) -> list[StackSample]:
        r = self._runs.get(run)
        return list(r.stacks.values()) if r is not None else []

    def forget(self, run: str) -> None:
        self._runs.pop(run, None)

    # --- internals -------------------------------------------------------------------------

    def _run(self, name: str) -> Run:
        run = self._runs.get(name)
        if run is None:
            run = self._runs[name] = Run()
            if self._numbered is not None:
                run.count = self._numbered(name)
        return run

    def _route(self, run: Run, name: str, fact: Fact) -> Open:
        window = self.config.window_s
        for inc in reversed(run.open):
            if fact.time - inc.last > window or inc.opened - fact.time > window:
                continue
            if fact.rank in inc.members:
                return inc
            kind = fact.kind
            cls: object = (kind, fact.step) if kind == rules.NONFINITE else kind
            hit = inc.memo.get(cls)
            if hit is None:
                hit = explains(inc, fact, self.config.spread_steps)
                if kind not in TIMED_KINDS:
                    inc.memo[cls] = hit
            if hit:
                return inc
        if len(run.open) >= OPEN_MAX:
            oldest = run.open.pop(0)
            self.evicted += 1
            if oldest.value is not None:
                run.keep(oldest.value)
        run.count += 1
        inc = Open(f"{name}#{run.count}", name, fact.time, last=fact.time)
        run.open.append(inc)
        return inc


_RANK, _WORLD = attrgetter("rank"), attrgetter("world_size")
_FIRST = itemgetter(0)
_NONFINITE, _CRASHED = rules.NONFINITE, rules.CRASHED
_EMPTY: dict[str, Column] = {}
