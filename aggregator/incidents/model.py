"""The values the incident tracker hands out: an incident, its evidence, its transitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

CAUSES = ("nonfinite", "divergence", "hang", "crash", "lost", "slow")
# acted: not the tracker's, the service's: the commands sent about it settled (actions/news.py)
CHANGES = ("opened", "updated", "resolved", "acted")

__all__ = ["CAUSES", "CHANGES", "Evidence", "Incident", "IncidentChange"]


@dataclass(frozen=True)
class Evidence:
    step: int | None
    time: float  # record time where known, else the aggregator's
    rank: int
    what: str  # for people: "loss non-finite", "crashed: RuntimeError: ...", "stalled at 19"

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Incident:
    id: str  # "<run>#<n>", n counting from 1 per run
    run: str
    cause: str  # one of CAUSES
    culprits: tuple[int, ...]  # the rank(s) it started on, the first first
    affected: tuple[int, ...]  # ranks that went bad after it and because of it
    terminated: tuple[int, ...]  # ranks the launcher killed after it
    timeline: tuple[Evidence, ...]  # culprits' evidence first, then by time; bounded
    opened: float  # time of the earliest evidence routed to it when it opened
    updated: float  # the aggregator's now at the last judgement
    resolved: float | None
    state: str  # firing | resolved
    summary: str  # one sentence
    basis: str  # why these culprits: "earliest step", "stacks", "first crash", ...
    step: int | None = None  # the fault step where known (first evidence step)
    evidence_count: int = 0  # evidence items held, the timeline shows at most TIMELINE_MAX

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.culprits + self.affected + self.terminated

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("culprits", "affected", "terminated"):
            out[key] = list(out[key])
        out["timeline"] = [e.as_dict() for e in self.timeline]
        return out


@dataclass(frozen=True)
class IncidentChange:
    change: str  # opened | updated (culprits or cause changed) | resolved | acted
    incident: Incident
    previous: Incident | None = None  # for "updated": what was announced before
    # the commands sent about it (``Issued.as_dict``), so its messages say what was done
    actions: tuple[Mapping[str, Any], ...] = ()
