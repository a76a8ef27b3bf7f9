"""Generic JSON: the title, the lines, and every alert's (or incident's) fields, for your own
receiver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.words import (
    IncidentNote,
    incident_text,
    incident_title,
    message_parts,
)


def payload(alerts: Sequence[Any]) -> Payload:
    dicts, title, lines = message_parts(alerts)
    return {
        "source": "rankwatch", "type": "alerts", "title": title, "text": "\n".join(lines),
        "alerts": dicts,
    }  # fmt: skip


def incident(notes: Sequence[IncidentNote]) -> Payload:
    return {
        "source": "rankwatch", "type": "incidents", "title": incident_title(notes),
        "text": incident_text(notes),
        "incidents": [
            {"change": n.change, "incident": n.incident, "link": n.link, "action": n.action}
            for n in notes
        ],
    }  # fmt: skip


KIND = WebhookKind("json", payload, aliases=("generic",), incident=incident)
