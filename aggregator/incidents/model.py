"""The values the incident tracker hands out: an incident, its evidence, its transitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

CAUSES = ("nonfinite", "divergence", "hang", "crash", "lost", "slow")
# acted: not the tracker's, the service's: the commands sent about it settled (actions/news.py)
CHANGES = ("opened", "updated", "resolved", "acted")

__all__ = [
    "CAUSES", "CHANGES", "RANGES_MAX", "Evidence", "Incident", "IncidentChange", "evidence_dict",
]  # fmt: skip


@dataclass(frozen=True)
class Evidence:
    """One item of a timeline: one rank's evidence, or the same evidence of ``count`` ranks
    (the same kind, metric and step, and the same words where it has its own: 4,095 peers
    failing in a collective at one step are one item, not 4,095)."""

    step: int | None
    time: float  # record time where known, else the aggregator's; a group's earliest
    rank: int  # a group's: the rank of its earliest
    what: str  # for people: "loss non-finite", "crashed: RuntimeError: ...", "stalled at 19"
    count: int = 1  # ranks it stands for
    # a group's ranks as (first, last) ranges, ascending, the first RANGES_MAX of them (they
    # cover fewer than ``count`` ranks when there are more); () for one rank
    ranks: tuple[tuple[int, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ranks"] = [list(span) for span in self.ranks]
        return out


RANGES_MAX = 32  # rank ranges an evidence group lists


def evidence_dict(item: Mapping[str, Any]) -> dict[str, Any]:
    """A timeline item as ``Evidence.as_dict`` has it, from a stored incident of any age (those
    stored before groups have one rank each and no ``count`` or ``ranks``)."""
    out = dict(item)
    out.setdefault("count", 1)
    out.setdefault("ranks", [])
    return out


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

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Incident:
        """``as_dict()`` back (a stored incident; keys it does not have are ignored)."""
        raw = {f.name: body[f.name] for f in fields(cls) if f.name in body}
        for key in ("culprits", "affected", "terminated"):
            raw[key] = tuple(raw.get(key) or ())
        raw["timeline"] = tuple(map(_evidence, raw.get("timeline") or ()))
        return cls(**raw)


def _evidence(item: Mapping[str, Any]) -> Evidence:
    e = evidence_dict(item)
    spans = tuple((int(lo), int(hi)) for lo, hi in e["ranks"])
    return Evidence(e["step"], e["time"], e["rank"], e["what"], e["count"], spans)


@dataclass(frozen=True)
class IncidentChange:
    change: str  # opened | updated (culprits or cause changed) | resolved | acted
    incident: Incident
    previous: Incident | None = None  # for "updated": what was announced before
    # the commands sent about it (``Issued.as_dict``), so its messages say what was done
    actions: tuple[Mapping[str, Any], ...] = ()
