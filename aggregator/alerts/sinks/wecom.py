"""WeCom (WeChat Work) group robots: markdown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.chat import service_error
from rankwatch.aggregator.alerts.sinks.words import (
    IncidentNote,
    incident_markdown,
    markdown,
    message_parts,
)


def payload(alerts: Sequence[Any]) -> Payload:
    _, title, lines = message_parts(alerts)
    return {"msgtype": "markdown", "markdown": {"content": markdown(title, lines)}}


def incident(notes: Sequence[IncidentNote]) -> Payload:
    return {"msgtype": "markdown", "markdown": {"content": incident_markdown(notes)}}


KIND = WebhookKind(
    "wecom", payload, check=service_error, aliases=("wechat", "wxwork"), incident=incident
)
