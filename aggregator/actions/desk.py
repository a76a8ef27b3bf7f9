"""The action desk: policies, commands from the page or the CLI, their sends and answers.

Owned by the service and called under its lock: ``incidents`` with each tick's incident
changes, ``tick`` to decide (policies), send what is due and expire what went unanswered,
``answer`` with each rank's ``command`` event, ``issue`` for a command someone asked for.
Sending is the caller's ``send(run, rank, message) -> bool`` (the receiver's); the commands
that changed are handed back for the store and the live feed. No clock, no socket, no store.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rankwatch.agent.wire.commands import ACK_EVENT, COMMAND_KINDS, CommandError
from rankwatch.agent.wire.records import EventRecord, RanksBlock, StepBlock, StepRecord
from rankwatch.aggregator.actions.agree import STOP_LEAD_S, stop_step, typical_step_time
from rankwatch.aggregator.actions.book import CommandBook, Issued
from rankwatch.aggregator.actions.policy import Case, Decision, PolicyEngine, Rule
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents.model import IncidentChange

log = logging.getLogger("rankwatch.actions")

Send = Callable[[str, int, dict[str, Any]], bool]  # (run, rank, message) -> sent
Health = Mapping[str, Mapping[int, RankHealth]]
LIVE_STATES = (RankState.ALIVE, RankState.STALLED, RankState.PAUSED)
MAX_CASES = 4096  # firing incidents followed for the policies
PACE_WEIGHT = 0.2  # weight of the newest step time in the run's moving average


class ActionError(ValueError):
    """A command that cannot be issued (unknown run or rank, nothing live, bad kind)."""


class ActionDesk:
    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.book = CommandBook()
        self.policy = PolicyEngine(rules)
        self._cases: dict[str, Case] = {}
        self._prefix = secrets.token_hex(3)  # ids stay unique across restarts of serve
        self._count = itertools.count(1)
        self._changed: dict[str, Issued] = {}
        # the highest step of each run's records as they arrive: the health snapshot the tick
        # hands in may be a second old, and a stop step must be ahead of where the ranks are
        self._highest: dict[str, tuple[int, float]] = {}  # run -> (step, its record time)
        self._pace: dict[str, float] = {}  # run -> seconds per step, from those records

    def steps(self, items: Iterable[StepRecord | StepBlock | RanksBlock]) -> None:
        for item in items:
            if type(item) is RanksBlock:  # as its records one by one
                top = max(item.step)
                prev = self._highest.get(item.run)
                if prev is None or top > prev[0]:
                    for step, made in zip(item.step, item.time, strict=True):
                        self._step(item.run, step, made)
                continue
            if type(item) is StepBlock:
                step, made = item.step[-1], item.time[-1]
                if item.step[0] < step and item.time[0] < made:  # the block's own pace
                    pace = (made - item.time[0]) / (step - item.step[0])
                    old = self._pace.get(item.run)
                    self._pace[item.run] = pace if old is None else old + PACE_WEIGHT * (pace - old)
            else:
                step, made = item.step, item.time
            self._step(item.run, step, made)

    def _step(self, run: str, step: int, made: float) -> None:
        highest = self._highest
        prev = highest.get(run)
        if prev is None or step > prev[0]:
            if prev is None and len(highest) >= MAX_CASES:
                self._pace.pop(next(iter(highest)), None)
                del highest[next(iter(highest))]
            highest[run] = (step, made)
            if prev is not None and made > prev[1]:
                pace = (made - prev[1]) / (step - prev[0])
                old = self._pace.get(run)
                self._pace[run] = pace if old is None else old + PACE_WEIGHT * (pace - old)

    def started(self, run: str) -> None:
        """A rank of ``run`` (re)started: its step count may begin again."""
        self._highest.pop(run, None)
        self._pace.pop(run, None)

    def incidents(self, changes: Iterable[IncidentChange]) -> None:
        for change in changes:
            case = Case.of(change.incident)
            if case.firing:
                self._cases[case.id] = case
                if len(self._cases) > MAX_CASES:
                    del self._cases[next(iter(self._cases))]
            else:
                self._cases.pop(case.id, None)

    def turn(
        self,
        now: float,
        health: Health,
        changes: Iterable[IncidentChange],
        events: Iterable[EventRecord],
        steps: Iterable[StepRecord | StepBlock | RanksBlock],
        send: Send,
        inc_of: Callable[[str, int], int],
    ) -> list[dict[str, Any]]:
        """One tick of the service: its new step records, incident changes and events (the
        ranks' answers among them), then ``tick``; the commands that changed, as dicts."""
        for ev in events:  # a start first: the steps after it are the new count's
            if ev.event == ACK_EVENT:
                self.answer(ev.run, ev.rank, ev.info, now)
            elif ev.event == "start":
                self.started(ev.run)
        self.steps(steps)
        self.incidents(changes)
        return [c.as_dict() for c in self.tick(now, health, send, inc_of)]

    def tick(
        self, now: float, health: Health, send: Send, inc_of: Callable[[str, int], int]
    ) -> list[Issued]:
        """Policies, then due sends, then expiry; the commands that changed."""
        if self.policy.rules and self._cases:
            highest = {run: self._top(run, ranks) for run, ranks in health.items()}
            for decision in self.policy.decide(list(self._cases.values()), highest):
                self._decided(decision, now, health, inc_of)
        for issued in self.book.decide(now):
            self._changed[issued.id] = issued
            if issued.phase != "go":
                what = f"moved to step {issued.step}" if issued.phase == "ask" else "aborted"
                log.warning("rankwatch: [ACTION] %s: %s %s %s: %s", issued.run, issued.kind,
                            issued.id, what, issued.reason)  # fmt: skip
        for issued, rank, message in self.book.sends(now):
            ok = send(issued.run, rank, message)
            self.book.sent(issued, rank, now, ok)
            self._changed[issued.id] = issued
        for issued in self.book.expire(now):
            self._changed[issued.id] = issued

        def last_step(run: str, rank: int) -> int | None:
            known = health.get(run, {}).get(rank)
            return known.last_step if known is not None else None

        for issued in self.book.passed(now, last_step):
            self._changed[issued.id] = issued
            log.warning("rankwatch: [ACTION] %s: %s %s: a rank went past step %s without acting "
                        "on it", issued.run, issued.kind, issued.id, issued.step)  # fmt: skip
        changed, self._changed = list(self._changed.values()), {}
        return changed

    def issue(
        self,
        run: str,
        kind: str,
        health: Health,
        now: float,
        inc_of: Callable[[str, int], int],
        *,
        by: str,
        reason: str = "",
        ranks: Iterable[int] | None = None,
        text: str = "",
        step: int | None = None,
        incident: str = "",
        wait_s: float = 0.0,
    ) -> Issued:
        """A command to ``ranks`` (default: every live rank) of a live run; sent at the next
        tick (``wait_s`` from now at most). ActionError says why it cannot be."""
        if kind not in COMMAND_KINDS:
            raise ActionError(f"unknown command {kind!r}; known: {', '.join(COMMAND_KINDS)}")
        known = health.get(run)
        if not known:
            raise ActionError(f"no live run {run!r}: commands go to ranks that are connected")
        live = {r for r, h in known.items() if h.state in LIVE_STATES}
        if ranks is None:
            chosen = sorted(live)
            if not chosen:
                raise ActionError(f"no rank of run {run!r} is live (all finished, crashed, lost)")
        else:
            chosen = sorted(set(ranks))
            unknown = [r for r in chosen if r not in known]
            if unknown:
                raise ActionError(f"run {run!r} has no rank {', '.join(map(str, unknown))} "
                                  f"(its ranks: {_span(sorted(known))})")  # fmt: skip
            gone = [r for r in chosen if r not in live]
            if gone:
                raise ActionError(f"rank {', '.join(map(str, gone))} of run {run!r} is not live")
        top, made = self._highest.get(run, (None, now))
        highest = max((s for s in [top, *(known[r].last_step for r in chosen)] if s is not None),
                      default=0)  # fmt: skip
        if kind != "note" and step is None:
            pace = self._pace.get(run) or typical_step_time(known[r].step_time for r in chosen)
            step = stop_step([highest], pace, lead_s=STOP_LEAD_S + wait_s, behind_s=now - made)
        ident = f"{kind[0]}{self._prefix}{next(self._count)}"
        try:
            issued = self.book.issue(
                ident, run, kind, chosen, None if kind == "note" else step, now=now, by=by,
                reason=reason, text=text, incs={r: inc_of(run, r) for r in chosen},
                incident=incident, hold=True, margin=max(2, (step or 0) - highest),
            )  # fmt: skip
        except CommandError as exc:
            raise ActionError(str(exc)) from None
        self._changed[issued.id] = issued
        at = f" at the end of step {step}" if kind != "note" else ""
        log.warning("rankwatch: [ACTION] %s: %s%s on %d rank(s), by %s%s", run, kind, at,
                    len(chosen), by, f" ({reason})" if reason else "")  # fmt: skip
        return issued

    def _decided(
        self, d: Decision, now: float, health: Health, inc_of: Callable[[str, int], int]
    ) -> None:
        run = d.case.run
        sent = [a for a in d.rule.actions if a != "notify"]
        if "notify" in d.rule.actions or not sent:
            issued = Issued(f"n{self._prefix}{next(self._count)}", run, "notify", (), None,
                            d.by, d.reason, now)  # fmt: skip
            issued.updated, issued.incident = now, d.case.id
            self.book.restore(issued.as_dict())
            self._changed[issued.id] = issued
            log.warning("rankwatch: [ACTION] %s: %s: notify: %s", run, d.by, d.reason)
        step: int | None = None
        for kind in sent:
            text = d.rule.text or f"rankwatch {d.by}: {d.reason}" if kind == "note" else ""
            try:
                issued = self.issue(run, kind, health, now, inc_of, by=d.by, reason=d.reason,
                                    text=text[:500], step=step, incident=d.case.id)  # fmt: skip
            except ActionError as exc:
                log.warning("rankwatch: [ACTION] %s: %s could not %s: %s", run, d.by, kind, exc)
                continue
            if kind != "note":
                step = issued.step  # checkpoint, then stop: at one step

    def answer(self, run: str, rank: int, info: Mapping[str, Any], now: float) -> None:
        issued = self.book.answer(run, rank, info, now)
        if issued is not None:
            self._changed[issued.id] = issued
            state = info.get("state")
            if state in ("refused", "failed", "late"):
                log.warning("rankwatch: [ACTION] %s rank %d %s %s %s: %s", run, rank, state,
                            issued.kind, issued.id, info.get("detail", ""))  # fmt: skip

    def restore(self, stored: Iterable[Mapping[str, Any]]) -> None:
        for body in stored:
            self.book.restore(body)

    def commands(self, run: str) -> list[dict[str, Any]]:
        return [c.as_dict() for c in self.book.of_run(run)]

    def counters(self) -> dict[str, int]:
        return dict(self.book.n)

    def _top(self, run: str, ranks: Mapping[int, RankHealth]) -> int | None:
        """The highest step of ``run`` seen: in its records and in its ranks' health."""
        steps = [h.last_step for h in ranks.values() if h.last_step is not None]
        if run in self._highest:
            steps.append(self._highest[run][0])
        return max(steps, default=None)


ACTION_KEYS = ("id", "cmd", "step", "by", "state", "counts", "created")  # on an incident


def annotate(
    incidents: Mapping[str, dict[str, Any]], commands: Iterable[Mapping[str, Any]]
) -> None:
    """Add to each incident (by id) the commands a policy sent about it, as ``actions``."""
    for command in commands:
        incident = incidents.get(str(command.get("incident") or ""))
        if incident is not None:
            action = {k: command.get(k) for k in ACTION_KEYS}  # a new list: the stored stays
            incident["actions"] = [*incident.get("actions", ()), action]


def _span(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:20])) + (" ..." if len(ranks) > 20 else "")
