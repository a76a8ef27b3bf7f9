"""Slack incoming webhooks: one mrkdwn text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.words import (
    IncidentNote,
    clip,
    incident_title,
    message_parts,
)


def escape(text: str) -> str:
    # Slack mrkdwn treats these three as control characters (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(alerts: Sequence[Any]) -> Payload:
    _, title, lines = message_parts(alerts)
    body = "\n".join(f"• {escape(line)}" for line in lines)
    return {"text": clip(f"*{escape(title)}*\n{body}")}


def incident(notes: Sequence[IncidentNote]) -> Payload:
    blocks = [f"*{escape(incident_title(notes))}*"]
    for note in notes:
        head = [f"*{escape(note.title.removeprefix('rankwatch '))}*"] if len(notes) > 1 else []
        link = [f"<{note.link}|open the dashboard at this step>"] if note.link else []
        blocks.append("\n".join([*head, *(escape(line) for line in note.lines), *link]))
    return {"text": clip("\n\n".join(blocks))}


KIND = WebhookKind("slack", payload, incident=incident)
