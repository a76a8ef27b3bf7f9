"""Generic JSON: the title, the lines, and every alert's fields, for your own receiver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.words import message_parts


def payload(alerts: Sequence[Any]) -> Payload:
    dicts, title, lines = message_parts(alerts)
    return {"source": "rankwatch", "title": title, "text": "\n".join(lines), "alerts": dicts}


KIND = WebhookKind("json", payload, aliases=("generic",))
