"""Slack incoming webhooks: one mrkdwn text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.words import clip, message_parts


def escape(text: str) -> str:
    # Slack mrkdwn treats these three as control characters (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(alerts: Sequence[Any]) -> Payload:
    _, title, lines = message_parts(alerts)
    body = "\n".join(f"• {escape(line)}" for line in lines)
    return {"text": clip(f"*{escape(title)}*\n{body}")}


KIND = WebhookKind("slack", payload)
