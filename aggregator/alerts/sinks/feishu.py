"""Feishu / Lark custom bots: text, signed in the body."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.chat import service_error
from rankwatch.aggregator.alerts.sinks.words import (
    IncidentNote,
    clip,
    incident_text,
    incident_title,
    message_parts,
)


def payload(alerts: Sequence[Any]) -> Payload:
    _, title, lines = message_parts(alerts)
    return {"msg_type": "text", "content": {"text": clip(title + "\n" + "\n".join(lines))}}


def signature(secret: str, now_s: int) -> str:
    """HMAC-SHA256 keyed by "timestamp\\nsecret" over an empty body."""
    digest = hmac.new(f"{now_s}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def sign(url: str, body: Payload, secret: str, now_s: float) -> tuple[str, Payload]:
    stamp = int(now_s)
    return url, {"timestamp": str(stamp), "sign": signature(secret, stamp), **body}


def incident(notes: Sequence[IncidentNote]) -> Payload:
    text = incident_title(notes) + "\n" + incident_text(notes)
    return {"msg_type": "text", "content": {"text": clip(text)}}


KIND = WebhookKind("feishu", payload, sign, service_error, aliases=("lark",), incident=incident)
