"""Alert webhooks: generic JSON, Slack, DingTalk, WeCom and Feishu/Lark.

Each sink has its own thread and bounded queue, so a slow or dead endpoint never slows
ingest or the other sinks. Alerts queued while a sink waits (rate limit, retry backoff) are
sent together in one message. URLs and secrets carry credentials: they are never logged; logs
and counters name a sink by its kind and host only.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
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

from rankwatch.agent.wire.jsonsafe import json_safe

log = logging.getLogger("rankwatch.webhooks")

WEBHOOK_KINDS = ("json", "slack", "dingtalk", "wecom", "feishu")
KIND_ALIASES = {"generic": "json", "lark": "feishu", "wechat": "wecom", "wxwork": "wecom"}
SEVERITIES = ("info", "warning", "critical")  # ordered; unknown severities are always sent

DEFAULT_TIMEOUT_S = 10.0  # one HTTP request
DEFAULT_ATTEMPTS = 4  # tries per message before giving up
DEFAULT_BACKOFF_S = 2.0  # first retry delay, doubled each time
DEFAULT_RATE_PER_MIN = 20.0  # DingTalk and WeCom bots accept 20 messages a minute
DEFAULT_QUEUE_MAX = 200  # alerts waiting per sink; the oldest is dropped beyond this
MAX_ALERTS_PER_MESSAGE = 20  # alerts coalesced into one chat message
MAX_TEXT_CHARS = 3500  # chat services cap message size (WeCom: 4096 bytes of markdown)
CLOSE_TIMEOUT_S = 2.0


@dataclasses.dataclass(frozen=True)
class WebhookConfig:
    kind: str
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
        kind = KIND_ALIASES.get(self.kind.lower(), self.kind.lower())
        if kind not in WEBHOOK_KINDS:
            raise ValueError(
                f"unknown webhook kind {self.kind!r}; expected one of "
                f"{', '.join(WEBHOOK_KINDS)} (or {', '.join(KIND_ALIASES)})"
            )
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
    def label(self) -> str:
        """How logs and counters name this sink: never the full URL."""
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


# --- message formatting ----------------------------------------------------------------------


def alert_dict(alert: Any) -> dict[str, Any]:
    """An Alert (dataclass) or a dict as a JSON-ready dict (NaN as "NaN")."""
    raw = dataclasses.asdict(alert) if dataclasses.is_dataclass(alert) else dict(alert)
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


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def _slack_escape(text: str) -> str:
    # Slack mrkdwn treats these three as control characters (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build_payload(kind: str, alerts: Sequence[Any]) -> dict[str, Any]:
    """The JSON body one message carries for ``kind`` (signing is added when sending)."""
    dicts = [alert_dict(a) for a in alerts]
    title = title_of(dicts)
    lines = [alert_line(a) for a in dicts]
    if kind == "json":
        return {"source": "rankwatch", "title": title, "text": "\n".join(lines), "alerts": dicts}
    if kind == "slack":
        body = "\n".join(f"• {_slack_escape(line)}" for line in lines)
        return {"text": _clip(f"*{_slack_escape(title)}*\n{body}")}
    markdown = _clip(f"### {title}\n\n" + "\n".join(f"- {line}" for line in lines))
    if kind == "dingtalk":
        return {"msgtype": "markdown", "markdown": {"title": title, "text": markdown}}
    if kind == "wecom":
        return {"msgtype": "markdown", "markdown": {"content": markdown}}
    if kind == "feishu":
        return {"msg_type": "text", "content": {"text": _clip(title + "\n" + "\n".join(lines))}}
    raise ValueError(f"unknown webhook kind {kind!r}")


def dingtalk_signed_url(url: str, secret: str, now_ms: int) -> str:
    """DingTalk "加签": HMAC-SHA256 keyed by the secret over "timestamp\\nsecret", in the URL."""
    digest = hmac.new(secret.encode(), f"{now_ms}\n{secret}".encode(), hashlib.sha256).digest()
    sign = urllib.parse.quote_plus(base64.b64encode(digest))
    return f"{url}{'&' if '?' in url else '?'}timestamp={now_ms}&sign={sign}"


def feishu_sign(secret: str, now_s: int) -> str:
    """Feishu/Lark signature: HMAC-SHA256 keyed by "timestamp\\nsecret" over an empty body."""
    digest = hmac.new(f"{now_s}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def _service_error(kind: str, body: bytes) -> str | None:
    """Chat services answer HTTP 200 with an error code in the body; None when it is OK."""
    if kind not in ("dingtalk", "wecom", "feishu"):
        return None
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return None  # not JSON: trust the HTTP status
    if not isinstance(answer, dict):
        return None
    for key in ("errcode", "code", "StatusCode"):
        code = answer.get(key)
        if code not in (None, 0):
            msg = answer.get("errmsg") or answer.get("msg") or answer.get("StatusMessage")
            return f"service error {code}: {str(msg)[:200]}"
    return None


# --- sending -------------------------------------------------------------------------------


class _Stop:
    pass


class WebhookSink:
    """One endpoint: a thread, a bounded queue, rate limiting, retries with backoff."""

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.queue_max)
        self._stop = threading.Event()
        self._last_send = -1e18
        self.counters: dict[str, Any] = {
            "sent": 0,
            "alerts_sent": 0,
            "retries": 0,
            "failed": 0,
            "alerts_failed": 0,
            "dropped": 0,
            "last_error": None,
        }
        self._logged_failure = False
        self._thread = threading.Thread(
            target=self._run, name=f"rankwatch-webhook-{config.kind}", daemon=True
        )
        self._thread.start()

    def wants(self, alert: Any) -> bool:
        severity = alert.get("severity") if isinstance(alert, Mapping) else alert.severity
        severity = getattr(severity, "value", severity)
        if severity not in SEVERITIES:
            return True
        return SEVERITIES.index(severity) >= SEVERITIES.index(self.config.min_severity)

    def submit(self, alert: Any) -> None:
        """Queue one alert; never blocks (drops the oldest queued alert when full)."""
        if self._stop.is_set() or not self.wants(alert):
            return
        while True:
            try:
                self._queue.put_nowait(alert)
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
        cfg = self.config
        interval = 60.0 / cfg.rate_per_min
        wait = self._last_send + interval - time.monotonic()
        if wait > 0:
            self._stop.wait(wait)  # returns early on close: then each batch gets one try
        payload = build_payload(cfg.kind, batch)
        delay = cfg.backoff_s
        for attempt in range(1, cfg.attempts + 1):
            self._last_send = time.monotonic()
            error = self._post(payload)
            if error is None:
                self.counters["sent"] += 1
                self.counters["alerts_sent"] += len(batch)
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
        self.counters["alerts_failed"] += len(batch)
        if not self._logged_failure:
            self._logged_failure = True
            log.warning(
                "webhook %s: gave up on a message of %d alert(s) after %d attempt(s): %s",
                cfg.label,
                len(batch),
                attempt,
                error,
            )

    def _post(self, payload: dict[str, Any]) -> str | None:
        """One HTTP POST; None on success, else an error text with no URL or secret in it."""
        cfg = self.config
        url = cfg.url
        if cfg.secret and cfg.kind == "dingtalk":
            url = dingtalk_signed_url(url, cfg.secret, int(time.time() * 1000))
        elif cfg.secret and cfg.kind == "feishu":
            now_s = int(time.time())
            payload = {"timestamp": str(now_s), "sign": feishu_sign(cfg.secret, now_s), **payload}
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
            return _service_error(cfg.kind, body)
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
    """All configured sinks: ``submit(alert)`` fans an alert transition out to each."""

    def __init__(self, configs: Sequence[WebhookConfig]) -> None:
        self.sinks = [WebhookSink(c) for c in configs]

    def submit(self, alert: Any) -> None:
        for sink in self.sinks:
            sink.submit(alert)

    def counters(self) -> dict[str, dict[str, Any]]:
        return {s.config.label: dict(s.counters, pending=s.pending()) for s in self.sinks}

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        for sink in self.sinks:
            sink.close(max(0.1, deadline - time.monotonic()))
