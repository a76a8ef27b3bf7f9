"""Webhook kinds register: a kind defined here is delivered to a real local HTTP server through
the config file and ``--webhook``, with nothing else changed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from rankwatch.aggregator.alerts.sinks import registry
from rankwatch.aggregator.alerts.sinks.base import Payload, Sink, WebhookKind
from rankwatch.aggregator.alerts.sinks.http import WebhookConfig, Webhooks
from rankwatch.aggregator.alerts.sinks.words import message_parts
from rankwatch.aggregator.config import ConfigError, parse_config, parse_webhook_flag
from rankwatch.aggregator.service import ServeConfig

from tests.aggregator.alerts.sinks.conftest import Capture, wait_for
from tests.aggregator.alerts.sinks.test_http import alert


def teams_payload(alerts: Sequence[Any]) -> Payload:
    _, title, lines = message_parts(alerts)
    return {"type": "message", "summary": title, "lines": lines}


def teams_sign(url: str, body: Payload, secret: str, now_s: float) -> tuple[str, Payload]:
    digest = hashlib.sha256(f"{secret}{int(now_s)}".encode()).hexdigest()
    return f"{url}?sig={digest}", body


def teams_check(body: bytes) -> str | None:
    return None if body.startswith(b'{"errcode": 0') else "service said no"


TEAMS = WebhookKind("teams", teams_payload, teams_sign, teams_check, aliases=("msteams",))


@pytest.fixture
def teams() -> Iterator[WebhookKind]:
    registry.register(TEAMS)
    yield TEAMS
    registry.unregister("teams")


def test_the_built_in_kinds_are_found_in_their_modules() -> None:
    assert set(registry.kinds()) == {"json", "slack", "dingtalk", "wecom", "feishu"}
    assert registry.resolve("LARK").name == "feishu" and registry.resolve("generic").name == "json"
    with pytest.raises(ValueError, match=r"unknown webhook kind .teams.; expected one of .*slack"):
        registry.resolve("teams")


def test_a_kind_defined_elsewhere_is_configured_and_delivered(
    teams: WebhookKind, server: tuple[str, Capture]
) -> None:
    base, capture = server
    raw = {"webhooks": [{"kind": "msteams", "url": f"{base}/teams", "secret": "k", "name": "t"}]}
    cfg = parse_config(raw, "rankwatch.toml", ServeConfig())
    flag = parse_webhook_flag(f"teams={base}/flag")
    assert [w.kind for w in cfg.webhooks] == ["teams"] and flag.kind == "teams"
    hooks = Webhooks(
        [
            *(WebhookConfig(**{**vars(w), "rate_per_min": 6000}) for w in cfg.webhooks),
            WebhookConfig(flag.kind, flag.url, rate_per_min=6000),
        ]
    )
    assert all(isinstance(s, Sink) for s in hooks.sinks)
    hooks.submit(alert())
    wait_for(lambda: len(capture.requests) == 2)
    hooks.close()
    ((path, body),) = capture.bodies("/teams")
    assert path.startswith("/teams?sig=") and body["type"] == "message"
    assert body["lines"][0].startswith("FIRING [critical] run r1, rank 2, loss")
    ((path, _),) = capture.bodies("/flag")
    assert path == "/flag"  # no secret: not signed
    counters = hooks.counters()
    assert counters["t"]["sent"] == 1 and counters["teams@127.0.0.1"]["sent"] == 1


def test_a_kind_whose_service_says_no_counts_a_failure(
    teams: WebhookKind, server: tuple[str, Capture]
) -> None:
    base, capture = server
    hooks = Webhooks([WebhookConfig("teams", f"{base}/badsign", rate_per_min=6000, attempts=1)])
    hooks.submit(alert())
    wait_for(lambda: hooks.sinks[0].counters["failed"] == 1)
    hooks.close()
    assert hooks.sinks[0].counters["last_error"] == "service said no"
    assert len(capture.bodies("/badsign")) == 1  # attempts=1: one request, its answer refused


def test_names_are_not_taken_twice(teams: WebhookKind) -> None:
    with pytest.raises(ValueError, match="'lark' is registered already"):
        registry.register(WebhookKind("other", teams_payload, aliases=("lark",)))
    with pytest.raises(ConfigError, match="unknown webhook kind 'skype'"):
        parse_config({"webhooks": [{"kind": "skype", "url": "https://x.y/z"}]}, "f", ServeConfig())
