"""What every alert sink offers, and the table that makes a webhook kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rankwatch.aggregator.alerts.sinks.words import IncidentNote

CLOSE_TIMEOUT_S = 2.0


@runtime_checkable
class Sink(Protocol):
    """Where alert transitions go. ``submit`` never blocks ingest; ``close`` is bounded.

    A sink that also takes incident transitions (one message when an incident opens, changes
    culprit or cause, or resolves) has a ``submit_incident(change)`` method as well; the service
    looks for it by name, so a sink without one keeps working unchanged. Such a sink with
    ``covered_alerts = False`` (the webhooks) is not given the rank alerts an incident stands
    for: the incident's messages say them once."""

    @property
    def name(self) -> str:
        """How logs and counters name the sink: never a URL or a secret."""
        ...

    def submit(self, alert: Any) -> None: ...

    def snapshot(self) -> dict[str, Any]:
        """The sink's counters, JSON-ready."""
        ...

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None: ...


Payload = dict[str, Any]


def _unsigned(url: str, payload: Payload, secret: str, now_s: float) -> tuple[str, Payload]:
    return url, payload


def _http_status_only(body: bytes) -> str | None:
    return None


@dataclass(frozen=True)
class WebhookKind:
    """One chat or HTTP service: how a message looks, how it is signed, how it fails.

    ``payload(alerts)``: the JSON body for a batch of alerts (dataclasses or dicts).
    ``incident(notes)``: the JSON body for a batch of incident changes (``IncidentNote``); a
    kind without one sends each note through ``payload`` as an alert (``note_as_alert``).
    ``sign(url, payload, secret, now_s)``: the URL and body to send when a secret is set.
    ``check(body)``: an error text when a 2xx answer still means "refused", else None.
    """

    name: str
    payload: Callable[[Sequence[Any]], Payload]
    sign: Callable[[str, Payload, str, float], tuple[str, Payload]] = _unsigned
    check: Callable[[bytes], str | None] = _http_status_only
    aliases: tuple[str, ...] = ()
    incident: Callable[[Sequence[IncidentNote]], Payload] | None = None


def describe(kinds: Mapping[str, WebhookKind]) -> str:
    """``json, slack, ... (or generic, lark, ...)``: for help texts and error messages."""
    names = ", ".join(kinds)
    aliases = [a for k in kinds.values() for a in k.aliases]
    return f"{names} (or {', '.join(aliases)})" if aliases else names
