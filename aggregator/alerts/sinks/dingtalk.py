"""DingTalk custom robots: markdown, signed in the URL ("加签")."""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.chat import service_error
from rankwatch.aggregator.alerts.sinks.words import (
    IncidentNote,
    incident_markdown,
    incident_title,
    markdown,
    message_parts,
)


def payload(alerts: Sequence[Any]) -> Payload:
    _, title, lines = message_parts(alerts)
    return {"msgtype": "markdown", "markdown": {"title": title, "text": markdown(title, lines)}}


def signed_url(url: str, secret: str, now_ms: int) -> str:
    """HMAC-SHA256 keyed by the secret over "timestamp\\nsecret", in the URL."""
    digest = hmac.new(secret.encode(), f"{now_ms}\n{secret}".encode(), hashlib.sha256).digest()
    sign = urllib.parse.quote_plus(base64.b64encode(digest))
    return f"{url}{'&' if '?' in url else '?'}timestamp={now_ms}&sign={sign}"


def sign(url: str, body: Payload, secret: str, now_s: float) -> tuple[str, Payload]:
    return signed_url(url, secret, int(now_s * 1000)), body


def incident(notes: Sequence[IncidentNote]) -> Payload:
    text = incident_markdown(notes)
    return {"msgtype": "markdown", "markdown": {"title": incident_title(notes), "text": text}}


KIND = WebhookKind("dingtalk", payload, sign, service_error, incident=incident)
