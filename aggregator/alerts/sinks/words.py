"""The words every sink uses for an alert (its JSON form, one line a person reads, a title) and
for an incident change (``IncidentNote``: a title, its lines and the dashboard link)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rankwatch.agent.wire.jsonsafe import json_safe
from rankwatch.aggregator.actions.words import incident_action
from rankwatch.aggregator.incidents.model import CHANGES, IncidentChange
from rankwatch.aggregator.incidents.oneline import one_line
from rankwatch.aggregator.incidents.words import dashboard_link, text, title

MAX_TEXT_CHARS = 3500  # chat services cap message size (WeCom: 4096 bytes of markdown)


def alert_dict(alert: Any) -> dict[str, Any]:
    """An Alert (dataclass) or a dict as a JSON-ready dict (NaN as "NaN"). Not through
    ``dataclasses.asdict``: it deep-copies a grouped alert's ranks (every rank, in a cascade)
    before ``json_safe`` makes a list of them anyway."""
    if dataclasses.is_dataclass(alert) and not isinstance(alert, type):
        return json_safe(alert)
    return {k: json_safe(v) for k, v in dict(alert).items()}


def alert_line(a: Mapping[str, Any]) -> str:
    """One line a person reads: state, severity, where, and the alert's own explanation."""
    state = str(a.get("state") or "firing").upper()
    where = [f"run {a.get('run')}"] if a.get("run") is not None else []
    if a.get("rank") is not None:
        where.append(f"rank {a['rank']}")
    if a.get("metric"):
        where.append(str(a["metric"]))
    message = message_line(str(a.get("message") or a.get("rule") or ""))
    since = ""
    if a.get("since_step") is not None and "since step" not in message:
        since = f" (since step {a['since_step']})"
    return f"{state} [{a.get('severity', '?')}] {', '.join(where)}: {message}{since}"


def message_line(message: str) -> str:
    """An alert message in one line: a crash's 40-line stack becomes its exception line
    (``rank 2 (node1) crashed: RuntimeError: ...``); the API keeps the whole text."""
    if "\n" not in message:
        return message
    head, crashed, rest = message.partition("crashed: ")
    return f"{head}{crashed}{one_line(rest)}" if crashed else one_line(message)


def title_of(alerts: Sequence[Mapping[str, Any]]) -> str:
    if len(alerts) == 1:
        a = alerts[0]
        return f"rankwatch {str(a.get('state') or 'firing').upper()}: {a.get('rule', 'alert')}"
    firing = sum(1 for a in alerts if a.get("state") != "resolved")
    return f"rankwatch: {firing} firing, {len(alerts) - firing} resolved"


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def message_parts(alerts: Sequence[Any]) -> tuple[list[dict[str, Any]], str, list[str]]:
    """The alerts as dicts, the message's title, and one line per alert."""
    dicts = [alert_dict(a) for a in alerts]
    return dicts, title_of(dicts), [alert_line(a) for a in dicts]


def markdown(title: str, lines: Sequence[str]) -> str:
    """The markdown body DingTalk and WeCom bots show, clipped to what they accept."""
    return clip(f"### {title}\n\n" + "\n".join(f"- {line}" for line in lines))


# --- incidents ---------------------------------------------------------------------------------

# A cause's severity, for a webhook's ``min_severity``: the faults that stop training are
# critical, a rank that drifts or lags is a warning.
INCIDENT_SEVERITY = {"divergence": "warning", "slow": "warning"}
DEFAULT_INCIDENT_SEVERITY = "critical"


@dataclasses.dataclass(frozen=True)
class IncidentNote:
    """What one message says about one incident change: every kind formats these."""

    change: str  # opened | updated | resolved
    title: str  # "rankwatch [INCIDENT] job: rank 2 non-finite"
    lines: tuple[str, ...]  # the sentence, the spread, what changed, the id and times
    link: str | None  # the dashboard at the run and the fault step, when the address is known
    incident: dict[str, Any]  # Incident.as_dict()
    action: dict[str, Any] | None = None  # what was done about it, or how to (``incident_action``)


def incident_severity(change: IncidentChange) -> str:
    return INCIDENT_SEVERITY.get(change.incident.cause, DEFAULT_INCIDENT_SEVERITY)


def incident_note(change: IncidentChange, public_url: str | None = None) -> IncidentNote:
    inc = change.incident
    link = dashboard_link(public_url, inc) if public_url else None
    lines = tuple(text(change).splitlines())
    action = change_action(change, public_url)
    if action is not None:
        lines += tuple(line for line in (action["line"], action["how"]) if line)
    body = {k: json_safe(v) for k, v in inc.as_dict().items()}
    return IncidentNote(change.change, f"rankwatch {title(change)}", lines, link, body, action)


def change_action(change: IncidentChange, public_url: str | None = None) -> dict[str, Any] | None:
    inc = change.incident
    return incident_action(change.actions, inc.run, change.change != "resolved", public_url)


def incident_title(notes: Sequence[IncidentNote]) -> str:
    if len(notes) == 1:
        return notes[0].title
    counts = {c: sum(1 for n in notes if n.change == c) for c in CHANGES}
    return "rankwatch incidents: " + ", ".join(f"{n} {c}" for c, n in counts.items() if n)


def merge_changes(changes: Sequence[IncidentChange]) -> list[IncidentChange]:
    """Changes of the same incident that queued up together as one: its latest judgement,
    announced as it was first (opened stays opened unless it resolved meanwhile; an update
    keeps what was announced before the first of them; an "acted" joins the change before it),
    with the latest commands about it."""
    merged: dict[str, IncidentChange] = {}
    for c in changes:
        first = merged.get(c.incident.id)
        if first is None:
            merged[c.incident.id] = c
            continue
        if c.change == "resolved":
            kind = "resolved"
        elif first.change == "opened" or c.change == "acted":
            kind = first.change  # what the commands did rides on the change told with them
        else:
            kind = "updated"
        merged[c.incident.id] = IncidentChange(
            kind, c.incident, first.previous or c.previous, c.actions or first.actions
        )
    return list(merged.values())


def note_as_alert(note: IncidentNote) -> dict[str, Any]:
    """An incident note in an alert's dict form, for a kind that formats alerts only."""
    inc = note.incident
    state = "resolved" if note.change == "resolved" else "firing"
    culprits = inc.get("culprits") or []
    head = note.title.removeprefix("rankwatch ")
    message = f"{head}: " + " ".join([*note.lines, *([note.link] if note.link else [])])
    return {
        "key": f"incident|{inc.get('id')}", "rule": f"incident {note.change}",
        "severity": INCIDENT_SEVERITY.get(str(inc.get("cause")), DEFAULT_INCIDENT_SEVERITY),
        "state": state, "run": inc.get("run"), "rank": culprits[0] if len(culprits) == 1 else None,
        "metric": None, "since_step": inc.get("step"), "since_time": inc.get("opened"),
        "time": inc.get("updated"), "value": None, "message": message, "ranks": culprits,
    }  # fmt: skip


def incident_markdown(notes: Sequence[IncidentNote]) -> str:
    """The markdown DingTalk and WeCom show: per incident its title, lines and link."""
    parts = [f"### {incident_title(notes)}"]
    for note in notes:
        if len(notes) > 1:
            parts.append(f"**{note.title.removeprefix('rankwatch ')}**")
        parts.append("\n".join(f"- {line}" for line in note.lines))
        if note.link:
            parts.append(f"[open the dashboard at this step]({note.link})")
    return clip("\n\n".join(parts))


def incident_text(notes: Sequence[IncidentNote]) -> str:
    """Plain text (Feishu, the json kind's ``text``): lines, then the link, per incident."""
    blocks = []
    for note in notes:
        head = [note.title] if len(notes) > 1 else []
        blocks.append("\n".join([*head, *note.lines, *([note.link] if note.link else [])]))
    return "\n\n".join(blocks)
