"""Incidents: the alerts and rank-state changes of one fault, grouped, with a culprit.

Pure: ``now`` is passed in. ``IncidentTracker.observe`` takes what the aggregator already has
(divergence verdicts, alert transitions, rank-health transitions, stack samples) and returns
incident transitions: ``opened``, ``updated`` (culprits or cause changed), ``resolved``.

Evidence joins an open incident of its run when the incident explains it (see ``_explains``):
the rank is already part of it, it is non-finite within ``spread_steps`` of the first non-finite
step, it is a collective failure, a stall or a kill after a fault. Anything else opens a second
incident. Each touched incident is judged again from all its evidence (``rules.judge``), once
per ``observe`` call: call it once per loop pass with everything new, not once per record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import islice

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.model import Evidence, Incident, IncidentChange
from rankwatch.aggregator.incidents.oneline import is_collective_failure, one_line
from rankwatch.aggregator.incidents.rules import Fact
from rankwatch.aggregator.incidents.stacks import StackSample
from rankwatch.aggregator.metrics import KNOWN_METRICS

DEFAULT_WINDOW_S = 120.0  # evidence this long after an incident's last is a new fault
DEFAULT_SPREAD_STEPS = 1  # non-finite this many steps after the first is propagation
TIMELINE_MAX = 64  # evidence items an Incident value carries (all are kept inside)
HISTORY_MAX = 256  # closed incidents kept per run, the oldest dropped first
OPEN_MAX = 64  # open incidents per run; past it the oldest is closed as it stands
EVIDENCE_MAX = 65_536  # evidence items held per incident (4,096 ranks x 16 metrics)
KILL_WORDS = ("sigterm", "sigkill", "terminated", "killed", "signal 9", "signal 15")

HealthInput = RankHealth | tuple[RankHealth, str]

__all__ = ["IncidentConfig", "IncidentTracker"]


@dataclass(frozen=True)
class IncidentConfig:
    window_s: float = DEFAULT_WINDOW_S
    spread_steps: int = DEFAULT_SPREAD_STEPS
    timeline_max: int = TIMELINE_MAX

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"incidents.window_s must be a positive number, got {self.window_s!r}")
        if self.spread_steps < 0:
            raise ValueError(f"incidents.spread_steps must be >= 0, got {self.spread_steps!r}")
        if self.timeline_max < 1:
            raise ValueError(f"incidents.timeline_max must be >= 1, got {self.timeline_max!r}")


@dataclass
class _Open:
    id: str
    run: str
    opened: float
    facts: dict[tuple[int, str, str], Fact] = field(default_factory=dict)
    members: set[int] = field(default_factory=set)  # ranks with evidence in it
    open_keys: set[tuple[int, str, str]] = field(default_factory=set)  # facts not yet over
    last: float = 0.0  # time of the latest evidence
    first: Fact | None = None  # the earliest evidence
    first_step: int | None = None  # the earliest non-finite step
    crash_lines: set[str] = field(default_factory=set)  # one-line messages of its crashes
    kinds: set[tuple[str, str]] = field(default_factory=set)  # (kind, metric) of its evidence
    value: Incident | None = None  # as last announced
    verdict: rules.Verdict | None = None


@dataclass
class _Run:
    count: int = 0
    open: list[_Open] = field(default_factory=list)
    history: list[Incident] = field(default_factory=list)
    health: dict[int, RankHealth] = field(default_factory=dict)
    stacks: dict[int, StackSample] = field(default_factory=dict)


class IncidentTracker:
    def __init__(self, config: IncidentConfig | None = None) -> None:
        self.config = config or IncidentConfig()
        self._runs: dict[str, _Run] = {}
        self.refused_stacks = 0  # samples for a rank the run has never reported
        self.evicted = 0  # open incidents closed unresolved to stay within OPEN_MAX
        self.dropped_evidence = 0  # evidence not held past EVIDENCE_MAX (still routed)

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
        (without it, ``now`` is their time). ``health``: ``HealthTracker.changes()`` items or
        bare ``RankHealth`` values.
        """
        facts: list[tuple[str, Fact]] = []
        recoveries: list[tuple[str, int, tuple[str, str] | None]] = []
        for item in health:
            h = item[0] if isinstance(item, tuple) else item
            self._run(h.run).health[h.rank] = h
            fact = _health_fact(h)
            if fact is not None:
                facts.append((h.run, fact))
            elif h.state in (RankState.ALIVE, RankState.PAUSED, RankState.FINISHED):
                recoveries.append((h.run, h.rank, None))
                self._runs[h.run].stacks.pop(h.rank, None)  # where it was no longer matters
        times = times or {}
        for d in divergences:
            t = times.get((d.run, d.rank, d.since_step), now) if times else now
            facts.append((d.run, _divergence_fact(d, t)))
        for d in resolved:
            recoveries.append((d.run, d.rank, (_divergence_kind(d.kind, d.metric), d.metric)))
        # A grouped alert's since_step is its earliest rank's: given to a rank that has its own
        # verdict it would move that rank back to the culprit's step. So it speaks only for the
        # ranks of the group that have no verdict of their own (this call or an open incident).
        own = {(run_name, f.rank, f.kind, f.metric) for run_name, f in facts}
        for a in alerts:
            grouped = a.rank is None and len(a.ranks) > 1
            for run_name, fact, recovery in _alert_items(a):
                if fact is not None and grouped and self._has_own(own, run_name, fact):
                    continue
                if fact is not None:
                    facts.append((run_name, fact))
                if recovery is not None:
                    recoveries.append((run_name, recovery[0], recovery[1]))
        touched: dict[int, tuple[_Run, _Open]] = {}
        for s in stacks:
            run = self._runs.get(s.run)
            if run is None or s.rank not in run.health:
                self.refused_stacks += 1
                continue
            run.stacks[s.rank] = s
            for inc in run.open:
                if s.rank in inc.members:
                    touched[id(inc)] = (run, inc)
        facts.sort(key=lambda rf: (rf[1].time, rf[1].rank))  # route causes before effects
        window = self.config.window_s
        for run_name, fact in facts:
            run = self._run(run_name)
            newest = run.open[-1] if run.open else None
            # The common case of a burst first: a rank already part of the newest incident.
            if (
                newest is not None
                and fact.rank in newest.members
                and fact.time - newest.last <= window
                and newest.opened - fact.time <= window
            ):
                inc = newest
            else:
                inc = self._route(run, run_name, fact)
            if (
                len(inc.facts) >= EVIDENCE_MAX
                and (fact.rank, fact.kind, fact.metric) not in inc.facts
            ):
                self.dropped_evidence += 1
                continue
            _add(inc, fact)
            touched[id(inc)] = (run, inc)
        for run_name, rank, key in recoveries:
            run = self._runs.get(run_name)
            if run is None:
                continue
            for inc in run.open:
                if _recover(inc, rank, key):
                    touched[id(inc)] = (run, inc)
        changes: list[IncidentChange] = []
        for run, inc in touched.values():
            changes.extend(self._judge(run, inc, now))
        return changes

    def _has_own(self, own: set[tuple[str, int, str, str]], run_name: str, fact: Fact) -> bool:
        if (run_name, fact.rank, fact.kind, fact.metric) in own:
            return True
        run = self._runs.get(run_name)
        key = (fact.rank, fact.kind, fact.metric)
        return run is not None and any(key in inc.facts for inc in run.open)

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

    def _run(self, name: str) -> _Run:
        run = self._runs.get(name)
        if run is None:
            run = self._runs[name] = _Run()
        return run

    def _route(self, run: _Run, name: str, fact: Fact) -> _Open:
        for inc in reversed(run.open):
            if self._explains(inc, fact):
                return inc
        if len(run.open) >= OPEN_MAX:
            oldest = run.open.pop(0)
            self.evicted += 1
            if oldest.value is not None:
                self._keep(run, oldest.value)
        run.count += 1
        inc = _Open(f"{name}#{run.count}", name, fact.time, last=fact.time)
        run.open.append(inc)
        return inc

    def _explains(self, inc: _Open, fact: Fact) -> bool:
        if fact.time - inc.last > self.config.window_s or inc.opened - fact.time > (
            self.config.window_s
        ):
            return False
        if fact.rank in inc.members:
            return True
        cause = inc.verdict.cause if inc.verdict is not None else _first_cause(inc)
        if fact.kind == rules.NONFINITE:
            first = inc.first_step
            return (
                cause == "nonfinite"
                and fact.step is not None
                and (first is None or fact.step <= first + self.config.spread_steps)
            )
        if fact.kind == rules.COLLECTIVE:
            return cause not in ("divergence",)
        if fact.kind == rules.CRASHED:
            # Peers that failed in a collective were waiting for someone: a crash that is not a
            # collective failure is who they waited for, whichever arrived first.
            # So is a crash that precedes the losses and kills that opened an incident.
            kinds = {k[0] for k in inc.kinds}
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

    def _judge(self, run: _Run, inc: _Open, now: float) -> list[IncidentChange]:
        old = inc.value
        if not inc.open_keys:
            run.open.remove(inc)
            if old is None:  # evidence that cleared before it was ever judged
                return []
            done = replace(old, state="resolved", resolved=now, updated=now)
            self._keep(run, done)
            return [IncidentChange("resolved", done, old)]
        since = inc.opened - self.config.window_s  # older samples are of another stall
        stacks = {r: s for r, s in run.stacks.items() if s.time >= since}
        verdict = rules.judge(inc.facts.values(), run.health, stacks)
        inc.verdict = verdict
        value = self._value(inc, verdict, now)
        inc.value = value
        if old is None:
            return [IncidentChange("opened", value)]
        if (old.culprits, old.cause) != (value.culprits, value.cause):
            return [IncidentChange("updated", value, old)]
        return []

    def _value(self, inc: _Open, v: rules.Verdict, now: float) -> Incident:
        culprits, limit = set(v.culprits), self.config.timeline_max
        shown = [f for f in v.facts if f.rank in culprits][:limit]
        if len(shown) < limit:
            shown += islice((f for f in v.facts if f.rank not in culprits), limit - len(shown))
        timeline = tuple(Evidence(f.step, f.time, f.rank, f.line) for f in shown)
        return Incident(
            inc.id, inc.run, v.cause, v.culprits, v.affected, v.terminated, timeline,
            inc.opened, now, None, "firing", v.summary, v.basis, v.step, len(inc.facts),
        )  # fmt: skip

    def _keep(self, run: _Run, done: Incident) -> None:
        run.history.append(done)
        if len(run.history) > HISTORY_MAX:
            del run.history[0]


_CONSEQUENCES = {rules.COLLECTIVE, rules.LOST, rules.KILLED, rules.STALLED}


def _add(inc: _Open, fact: Fact) -> None:
    key = (fact.rank, fact.kind, fact.metric)
    old = inc.facts.get(key)
    # The same evidence twice (a verdict and its alert): the earlier step says more.
    if old is None or (fact.step is not None and (old.step is None or fact.step < old.step)):
        inc.facts[key] = fact
    inc.open_keys.add(key)
    inc.members.add(fact.rank)
    if fact.time > inc.last:
        inc.last = fact.time
    inc.kinds.add(key[1:])
    if inc.first is None or fact.time < inc.first.time:
        inc.first = fact
    if fact.kind == rules.NONFINITE and fact.step is not None:
        inc.first_step = fact.step if inc.first_step is None else min(inc.first_step, fact.step)
    if fact.kind == rules.CRASHED:
        inc.crash_lines.add(fact.detail)


def _first_cause(inc: _Open) -> str:
    """The cause as the earliest evidence says, before the incident is first judged."""
    return _CAUSE_OF_KIND[inc.first.kind] if inc.first is not None else ""


_CAUSE_OF_KIND = {
    rules.NONFINITE: "nonfinite", rules.OUTLIER: "divergence", rules.STRAGGLER: "slow",
    rules.CRASHED: "crash", rules.COLLECTIVE: "crash", rules.STALLED: "hang",
    rules.LOST: "lost", rules.KILLED: "lost",
}  # fmt: skip


def _recover(inc: _Open, rank: int, key: tuple[str, str] | None) -> bool:
    if rank not in inc.members:
        return False
    before = len(inc.open_keys)
    if key is None:  # alive again: every health fact of the rank is over
        inc.open_keys.difference_update((rank, kind, "") for kind in _HEALTH_KINDS)
    else:
        inc.open_keys.discard((rank, *key))
    return len(inc.open_keys) != before


_HEALTH_KINDS = (rules.STALLED, rules.LOST, rules.CRASHED, rules.COLLECTIVE, rules.KILLED)


_DIVERGENCE_KINDS = {"outlier": rules.OUTLIER, "nonfinite": rules.NONFINITE,
                     "straggler": rules.STRAGGLER}  # fmt: skip


# In synchronous data parallelism every rank waits for the slowest in the all-reduce, so a slow
# rank's step time is everyone's; what stands out is its own time outside the step (data_time),
# which the detector reports as an outlier. An outlier in a timing metric is slowness.
_TIMING_METRICS = frozenset(m.name for m in KNOWN_METRICS if m.unit in ("s", "samples/s"))


def _divergence_kind(kind: str, metric: str) -> str:
    out = _DIVERGENCE_KINDS.get(kind, rules.OUTLIER)
    return rules.STRAGGLER if out == rules.OUTLIER and metric in _TIMING_METRICS else out


def _divergence_fact(d: Divergence, time: float) -> Fact:
    kind = _divergence_kind(d.kind, d.metric)
    if kind == rules.NONFINITE:
        what = f"{d.metric} non-finite"
    else:
        what = f"{d.metric} {d.direction} (z {d.z:.1f}, {d.rel:.2f}x the median)"
    return Fact(kind, d.rank, d.since_step, time, d.metric, what)


def _health_fact(h: RankHealth) -> Fact | None:
    msg = h.message
    if h.state is RankState.CRASHED:
        if is_collective_failure(msg):  # most of a burst: its one line is made when shown
            return Fact(rules.COLLECTIVE, h.rank, h.last_step, h.since, "", "", raw=msg)
        line = one_line(msg)
        if _killed(msg):
            return Fact(rules.KILLED, h.rank, h.last_step, h.since, "", f"killed: {line}", line)
        return Fact(rules.CRASHED, h.rank, h.last_step, h.since, "", f"crashed: {line}", line)
    if h.state is RankState.FINISHED and _killed(msg):
        return Fact(rules.KILLED, h.rank, h.last_step, h.since, "", msg, msg)
    if h.state is RankState.LOST:
        return Fact(rules.LOST, h.rank, h.last_step, h.since, "", f"lost: {msg}", msg)
    if h.state is RankState.STALLED:
        return Fact(
            rules.STALLED, h.rank, h.last_step, h.since, "", f"stalled at step {h.last_step}", msg
        )
    return None


def _killed(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in KILL_WORDS)


_ALERT_KINDS = {"nonfinite": rules.NONFINITE, "divergence": rules.OUTLIER,
                "straggler": rules.STRAGGLER}  # fmt: skip


def _alert_items(
    a: Alert,
) -> list[tuple[str, Fact | None, tuple[int, tuple[str, str] | None] | None]]:
    """Divergence-rule alerts as evidence (per rank of a grouped alert); health rules come
    through ``health`` with their messages, run-level rules (threshold, plateau, throughput)
    name no rank and are left to the alert sinks."""
    kind = _ALERT_KINDS.get(a.rule)
    if kind is None or a.metric is None:
        return []
    kind = _divergence_kind(kind, a.metric)
    ranks = a.ranks or ((a.rank,) if a.rank is not None else ())
    out: list[tuple[str, Fact | None, tuple[int, tuple[str, str] | None] | None]] = []
    for rank in ranks:
        if a.state == "resolved":
            out.append((a.run, None, (rank, (kind, a.metric))))
        else:
            what = f"{a.metric} non-finite" if kind == rules.NONFINITE else a.message[:200]
            fact = Fact(kind, rank, a.since_step, a.since_time, a.metric, what)
            out.append((a.run, fact, None))
    return out
