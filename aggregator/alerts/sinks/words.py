"""The words every sink uses for an alert: its JSON form, one line a person reads, a title."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rankwatch.agent.wire.jsonsafe import json_safe

MAX_TEXT_CHARS = 3500  # chat services cap message size (WeCom: 4096 bytes of markdown)


def alert_dict(alert: Any) -> dict[str, Any]:
    """An Alert (dataclass) or a dict as a JSON-ready dict (NaN as "NaN")."""
    is_instance = dataclasses.is_dataclass(alert) and not isinstance(alert, type)
    raw = dataclasses.asdict(alert) if is_instance else dict(alert)
    return {k: json_safe(v) for k, v in raw.items()}


def alert_line(a: Mapping[str, Any]) -> str:
    """One line a person reads: state, severity, where, and the alert's own explanation."""
    state = str(a.get("state") or "firing").upper()
    where = [f"run {a.get('run')}"] if a.get("run") is not None else []
    if a.get("rank") is not None:
        where.append(f"rank {a['rank']}")
    if a.get("metric"):
        where.append(str(a["metric"]))
    message = str(a.get("message") or a.get("rule") or "")
    since = ""
    if a.get("since_step") is not None and "since step" not in message:
        since = f" (since step {a['since_step']})"
    return f"{state} [{a.get('severity', '?')}] {', '.join(where)}: {message}{since}"


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
