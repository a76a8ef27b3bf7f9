"""What an incident's messages say about the commands sent about it. Pure.

An incident change of a tick carries the commands of its incident (a policy decides in the
tick the incident opens, so its "opened" message already names the stop). The ranks answer
later: when every command about an incident is settled (done, aborted, incomplete), that is one
"acted" message for the incident (``[ACTION]``), never one per rank or per answer.

After a restart of serve the commands come back from the store (``restore``): one stored as
settled was told by the serve that settled it; the incident of one still waiting is taken from
the store too, since the new serve's tracker does not hold it (and may give its id to a new
incident of the run), so its outcome is still told once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rankwatch.aggregator.incidents.model import Incident, IncidentChange

log = logging.getLogger("rankwatch.actions")

MAX_TOLD = 4096  # command ids whose outcome was told, remembered to tell each once

Command = Mapping[str, Any]


class ActionNews:
    def __init__(self) -> None:
        self._told: OrderedDict[str, None] = OrderedDict()
        self._restored: dict[str, Incident] = {}  # id -> an earlier serve's incident, untold

    def restore(
        self,
        commands: Iterable[Command],
        stored: Callable[[str], Sequence[Mapping[str, Any]]],
    ) -> None:
        """Commands taken back from the store at a start; ``stored(run)``: the run's stored
        incidents (``Incident.as_dict()`` bodies)."""
        waiting: dict[str, str] = {}  # incident id -> run
        for c in commands:
            if _settled(c):
                self._remember(str(c.get("id")))
            elif c.get("incident") and c.get("cmd") != "notify":
                waiting[str(c["incident"])] = str(c.get("run"))
        for run in sorted(set(waiting.values())):
            for body in stored(run):
                ident = str(body.get("id"))
                if waiting.get(ident) != run or len(self._restored) >= MAX_TOLD:
                    continue
                try:
                    self._restored[ident] = Incident.from_dict(body)
                except (KeyError, TypeError, ValueError) as exc:  # the command still settles
                    log.warning("rankwatch: stored incident %s unreadable (%r): its commands' "
                                "outcome will not be told", ident, exc)  # fmt: skip

    def take(
        self,
        changes: Sequence[IncidentChange],
        changed: Iterable[Command],
        commands_of: Callable[[str], Sequence[Command]],
        incident_of: Callable[[str, str], Incident | None],
    ) -> tuple[list[IncidentChange], list[IncidentChange]]:
        """``changes`` with their incidents' commands; and the "acted" changes to tell for
        incidents whose commands (``changed`` this tick among them) are all settled now.
        ``commands_of(run)``: the run's commands; ``incident_of(run, id)``: the live incident."""
        about: dict[str, list[Command]] = {}

        def of(run: str, ident: str) -> list[Command]:
            if ident not in about:
                about[ident] = [c for c in commands_of(run) if c.get("incident") == ident]
            return about[ident]

        out = []
        for change in changes:
            inc = change.incident
            got = of(inc.run, inc.id)
            out.append(replace(change, actions=tuple(got)) if got else change)
            for c in got:
                if _settled(c):
                    self._remember(str(c.get("id")))  # this message already says how it ended
        told = {c.incident.id for c in changes}
        news = []
        for c in changed:
            ident, run = str(c.get("incident") or ""), str(c.get("run"))
            if not ident or ident in told or not _settled(c) or str(c.get("id")) in self._told:
                continue
            got = of(run, ident)
            if not all(_settled(x) for x in got):
                continue  # checkpoint done, stop still waiting: one message when both are
            incident = self._restored.pop(ident, None) or incident_of(run, ident)
            if incident is None:
                continue
            for x in got:
                self._remember(str(x.get("id")))
            told.add(ident)
            news.append(IncidentChange("acted", incident, None, tuple(got)))
        return out, news

    def _remember(self, ident: str) -> None:
        self._told[ident] = None
        if len(self._told) > MAX_TOLD:
            self._told.popitem(last=False)


def _settled(c: Command) -> bool:
    return c.get("cmd") != "notify" and bool(c.get("ranks")) and c.get("state") != "waiting"
