"""What people read about an incident: a title and text for every alert sink, a dashboard link,
the lines ``rankwatch status`` prints first. Pure; the sinks format these words their own way.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from urllib.parse import quote, urlencode

from rankwatch.aggregator.incidents.model import Incident, IncidentChange

LINK_STEPS = 20  # steps shown either side of the fault step in a link
STATUS_RANKS = 8  # ranks listed in a status line before "+N more"

__all__ = ["dashboard_link", "spread_line", "status_lines", "text", "title"]


def title(change: IncidentChange) -> str:
    """``[INCIDENT] job: rank 2 non-finite`` / ``[UPDATED]`` / ``[RESOLVED]`` / ``[ACTION]``."""
    inc = change.incident
    head = {"opened": "INCIDENT", "updated": "UPDATED", "resolved": "RESOLVED",
            "acted": "ACTION"}[change.change]  # fmt: skip
    return f"[{head}] {inc.run}: {_who(inc.culprits)} {_CAUSE_WORDS[inc.cause]}"


def text(change: IncidentChange, public_url: str | None = None) -> str:
    """The sentence, what changed, when, and a link when the server knows its address."""
    inc = change.incident
    lines = [inc.summary + "."]
    if spread := spread_line(inc):
        lines.append(spread)
    prev = change.previous
    if change.change == "updated" and prev is not None:
        lines.append(
            f"was: {_who(prev.culprits)} {_CAUSE_WORDS[prev.cause]} ({prev.basis}); "
            f"now: {inc.basis}"
        )
    when = f"opened {_iso(inc.opened)}"
    if inc.resolved is not None:
        when += f", resolved {_iso(inc.resolved)}"
    lines.append(f"{inc.id}, {when}")
    if public_url:
        lines.append(dashboard_link(public_url, inc))
    return "\n".join(lines)


def spread_line(inc: Incident) -> str:
    """``fault step 20; 63 ranks affected after it; 1 terminated by the launcher`` (or "")."""
    parts = [f"fault step {inc.step}"] if inc.step is not None else []
    if inc.affected:
        parts.append(f"{len(inc.affected)} {_ranks_word(inc.affected)} affected after it")
    if inc.terminated:
        parts.append(f"{len(inc.terminated)} terminated by the launcher")
    return "; ".join(parts)


def _ranks_word(ranks: tuple[int, ...]) -> str:
    return "rank" if len(ranks) == 1 else "ranks"


def dashboard_link(public_url: str, inc: Incident) -> str:
    """The dashboard at the run, the culprits selected, zoomed around the fault step."""
    params = {"run": inc.run}
    if inc.culprits:
        params["sel"] = ",".join(map(str, inc.culprits[:64]))
    if inc.step is not None:
        params["zoom"] = f"{max(inc.step - LINK_STEPS, 0)}-{inc.step + LINK_STEPS}"
    return f"{public_url.rstrip('/')}/#{urlencode(params, quote_via=quote, safe=',')}"


def status_lines(incidents: Iterable[Incident]) -> list[str]:
    """One or two lines per incident, open ones first, newest first within each."""
    ordered = sorted(incidents, key=lambda i: (i.state != "firing", -i.opened, i.id))
    out = []
    for inc in ordered:
        state = "OPEN" if inc.state == "firing" else "resolved"
        out.append(f"{state:8} {inc.id}: {inc.summary}")
        extra = []
        if inc.affected:
            extra.append(f"{len(inc.affected)} affected")
        if inc.terminated:
            extra.append(f"{len(inc.terminated)} terminated")
        step = f"fault step {inc.step}, " if inc.step is not None else ""
        out.append(f"         {step}{', '.join(extra) + ', ' if extra else ''}basis: {inc.basis}")
    return out


_CAUSE_WORDS = {
    "nonfinite": "non-finite", "divergence": "diverged", "hang": "hung", "crash": "crashed",
    "lost": "lost", "slow": "slow",
}  # fmt: skip


def _who(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= STATUS_RANKS:
        return "ranks " + ", ".join(map(str, ranks))
    return f"{len(ranks)} ranks"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
