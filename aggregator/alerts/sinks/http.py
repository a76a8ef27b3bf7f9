"""Webhook delivery, the same for every kind: a thread, a bounded queue, rate limit, retries.

Each webhook has its own thread and bounded queue, so a slow or dead endpoint never slows
ingest or the other webhooks. Alerts queued while a webhook waits (rate limit, retry backoff)
are sent together in one message; so are incident changes (one message for those, another for
the alerts). A webhook is told of incidents (``submit_incident``: opened, culprit or cause
changed, resolved) and not of the rank alerts an incident stands for (``covered_alerts``).
What differs between kinds (payload, signing, the answer's error code) is the kind's table
(``WebhookKind``, one module per kind). URLs and secrets carry credentials: they are never
logged; logs and counters name a webhook by its kind and host only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from rankwatch.aggregator.alerts.sinks.base import CLOSE_TIMEOUT_S, Payload, WebhookKind
from rankwatch.aggregator.alerts.sinks.registry import resolve
from rankwatch.aggregator.alerts.sinks.words import (
    IncidentNote,
    incident_note,
    incident_severity,
    merge_changes,
    note_as_alert,
)
from rankwatch.aggregator.incidents.model import IncidentChange

log = logging.getLogger("rankwatch.webhooks")

SEVERITIES = ("info", "warning", "critical")  # ordered; unknown severities are always sent
DEFAULT_TIMEOUT_S = 10.0  # one HTTP request
DEFAULT_ATTEMPTS = 4  # tries per message before giving up
DEFAULT_BACKOFF_S = 2.0  # first retry delay, doubled each time
DEFAULT_RATE_PER_MIN = 20.0  # DingTalk and WeCom bots accept 20 messages a minute
DEFAULT_QUEUE_MAX = 200  # alerts waiting per webhook; the oldest is dropped beyond this
MAX_ALERTS_PER_MESSAGE = 20  # alerts coalesced into one chat message


@dataclasses.dataclass(frozen=True)
class WebhookConfig:
    kind: str  # any name or alias the registry knows; stored as the kind's own name
    url: str
    secret: str | None = None
    name: str | None = None
    min_severity: str = "info"
    rate_per_min: float = DEFAULT_RATE_PER_MIN
    timeout_s: float = DEFAULT_TIMEOUT_S
    attempts: int = DEFAULT_ATTEMPTS
    backoff_s: float = DEFAULT_BACKOFF_S
    queue_max: int = DEFAULT_QUEUE_MAX

    def __post_init__(self) -> None:
        kind = resolve(self.kind).name
        object.__setattr__(self, "kind", kind)
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"webhook URL for {kind} must be http(s)://host/..., got {redact(self.url)}"
            )
        if self.min_severity not in SEVERITIES:
            raise ValueError(f"min_severity must be one of {SEVERITIES}, got {self.min_severity!r}")
        if self.rate_per_min <= 0 or self.attempts < 1 or self.timeout_s <= 0:
            raise ValueError("webhook rate_per_min, attempts and timeout_s must be positive")

    @property
    def table(self) -> WebhookKind:
        return resolve(self.kind)

    @property
    def label(self) -> str:
        """How logs and counters name this webhook: never the full URL."""
        return self.name or f"{self.kind}@{urllib.parse.urlsplit(self.url).hostname}"

    def __repr__(self) -> str:  # the dataclass repr would print the URL and the secret
        return f"WebhookConfig({self.label!r}, url={redact(self.url)!r})"


def redact(url: str) -> str:
    """``scheme://host[:port]/…``: enough to recognise the endpoint, no path or token."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid url>"
    return f"{parts.scheme}://{host}{port}/…"


def build_payload(kind: str, alerts: Sequence[Any]) -> Payload:
    """The JSON body one message carries for ``kind`` (signing is added when sending)."""
    return resolve(kind).payload(alerts)


def incident_payload(kind: WebhookKind, notes: Sequence[IncidentNote]) -> Payload:
    """The JSON body of one message about incident changes, for ``kind``."""
    if kind.incident is not None:
        return kind.incident(notes)
    return kind.payload([note_as_alert(n) for n in notes])


class _Stop:
    pass


class WebhookSink:
    """One endpoint: a thread, a bounded queue, rate limiting, retries with backoff.

    ``public_url``: the dashboard's address as people reach it; incident messages then link to
    the run at the fault step."""

    covered_alerts = False  # the rank alerts an incident stands for are not sent: its messages are

    def __init__(self, config: WebhookConfig, public_url: str | None = None) -> None:
        self.config = config
        self.public_url = public_url
        self._kind = config.table
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.queue_max)
        self._stop = threading.Event()
        self._last_send = -1e18
        self.counters: dict[str, Any] = {
            "queued": 0,  # alerts and incident changes taken
            "sent": 0,
            "alerts_sent": 0,
            "retries": 0,
            "failed": 0,
            "alerts_failed": 0,
            "incidents_sent": 0,
            "incidents_failed": 0,
            "dropped": 0,
            "last_error": None,
        }
        self._logged_failure = False
        self._thread = threading.Thread(
            target=self._run, name=f"rankwatch-webhook-{config.kind}", daemon=True
        )
        self._thread.start()

    @property
    def name(self) -> str:
        return self.config.label

    def snapshot(self) -> dict[str, Any]:
        return dict(self.counters, pending=self.pending())

    def wants(self, alert: Any) -> bool:
        severity = alert.get("severity") if isinstance(alert, Mapping) else alert.severity
        severity = getattr(severity, "value", severity)
        if severity not in SEVERITIES:
            return True
        return SEVERITIES.index(severity) >= SEVERITIES.index(self.config.min_severity)

    def submit(self, alert: Any) -> None:
        """Queue one alert; never blocks (drops the oldest queued item when full)."""
        if not self._stop.is_set() and self.wants(alert):
            self._put(alert)

    def submit_incident(self, change: IncidentChange) -> None:
        """Queue one incident change (opened, updated, resolved); never blocks."""
        if self._stop.is_set() or not self.wants({"severity": incident_severity(change)}):
            return
        self._put(change)

    def _put(self, item: Any) -> None:
        while True:
            try:
                self._queue.put_nowait(item)
                self.counters["queued"] += 1
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
                    self.counters["dropped"] += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, _Stop):
                return
            batch = [item]
            stop_after = False
            while len(batch) < MAX_ALERTS_PER_MESSAGE:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(more, _Stop):
                    stop_after = True
                    break
                batch.append(more)
            self._deliver(batch)
            if stop_after:
                return

    def _deliver(self, batch: list[Any]) -> None:
        """The batch's incident changes in one message (first: they say what broke), then its
        alerts in another."""
        changes = [item for item in batch if isinstance(item, IncidentChange)]
        alerts = [item for item in batch if not isinstance(item, IncidentChange)]
        if changes:
            notes = [incident_note(c, self.public_url) for c in merge_changes(changes)]
            self._send(incident_payload(self._kind, notes), "incidents", len(changes))
        if alerts:
            self._send(self._kind.payload(alerts), "alerts", len(alerts))

    def _send(self, payload: Payload, what: str, count: int) -> None:
        cfg = self.config
        interval = 60.0 / cfg.rate_per_min
        wait = self._last_send + interval - time.monotonic()
        if wait > 0:
            self._stop.wait(wait)  # returns early on close: then each batch gets one try
        delay = cfg.backoff_s
        for attempt in range(1, cfg.attempts + 1):
            self._last_send = time.monotonic()
            error = self._post(payload)
            if error is None:
                self.counters["sent"] += 1
                self.counters[f"{what}_sent"] += count
                if self._logged_failure:
                    log.info("webhook %s delivers again", cfg.label)
                    self._logged_failure = False
                return
            self.counters["last_error"] = error
            if error.startswith("permanent") or attempt == cfg.attempts or self._stop.is_set():
                break
            self.counters["retries"] += 1
            if self._stop.wait(delay):
                break
            delay *= 2
        self.counters["failed"] += 1
        self.counters[f"{what}_failed"] += count
        if not self._logged_failure:
            self._logged_failure = True
            log.warning(
                "webhook %s: gave up on a message of %d %s after %d attempt(s): %s",
                cfg.label,
                count,
                what,
                attempt,
                error,
            )

    def _post(self, payload: Payload) -> str | None:
        """One HTTP POST; None on success, else an error text with no URL or secret in it."""
        cfg = self.config
        url = cfg.url
        if cfg.secret:
            url, payload = self._kind.sign(url, payload, cfg.secret, time.time())
        data = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
        request = urllib.request.Request(
            url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json; charset=utf-8", "User-Agent": "rankwatch"},
        )
        try:
            with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
                body = response.read(65536)
            return self._kind.check(body)
        except urllib.error.HTTPError as exc:
            status = exc.code
            exc.close()
            # 4xx other than timeout / too-many-requests will not get better by retrying.
            prefix = "permanent " if 400 <= status < 500 and status not in (408, 429) else ""
            return f"{prefix}HTTP {status}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return self._scrub(f"{type(exc).__name__}: {reason}")

    def _scrub(self, text: str) -> str:
        for secret in (self.config.url, self.config.secret):
            if secret:
                text = text.replace(secret, "<redacted>")
        return text[:300]

    def pending(self) -> int:
        return self._queue.qsize()

    def settled(self) -> bool:
        """Everything taken was sent, given up or dropped (nothing queued or in flight)."""
        c = self.counters
        done = sum(c[k] for k in ("alerts_sent", "alerts_failed", "incidents_sent"))
        return done + c["incidents_failed"] + c["dropped"] == c["queued"]

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop: what is queued gets one try each, bounded by ``timeout``; a hung endpoint is
        abandoned (the thread is a daemon)."""
        if not self._thread.is_alive():
            return
        self._stop.set()  # cut backoff and rate-limit waits short
        with contextlib.suppress(queue.Full):
            self._queue.put(_Stop(), timeout=timeout)
        self._thread.join(timeout)


class Webhooks:
    """All configured webhooks: ``submit(alert)`` fans an alert transition out to each,
    ``submit_incident(change)`` an incident change."""

    def __init__(self, configs: Sequence[WebhookConfig], public_url: str | None = None) -> None:
        self.sinks = [WebhookSink(c, public_url) for c in configs]

    def submit(self, alert: Any) -> None:
        for sink in self.sinks:
            sink.submit(alert)

    def submit_incident(self, change: IncidentChange) -> None:
        for sink in self.sinks:
            sink.submit_incident(change)

    def counters(self) -> dict[str, dict[str, Any]]:
        return {s.name: s.snapshot() for s in self.sinks}

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        for sink in self.sinks:
            sink.close(max(0.1, deadline - time.monotonic()))
