"""Webhook sinks against a real local HTTP server that records what it is sent."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
import urllib.parse
from typing import Any

import pytest
from rankwatch.aggregator.alerts.sinks.http import (
    WebhookConfig,
    Webhooks,
    WebhookSink,
    build_payload,
)

from tests.aggregator.alerts.sinks.conftest import Capture, fast, wait_for

SECRET = "SECdeadbeef"
TOKEN = "tok3n-in-the-path"


def alert(i: int = 0, state: str = "firing", severity: str = "critical") -> dict[str, Any]:
    return {
        "key": f"divergence:r1:2:loss:{i}", "rule": "divergence", "severity": severity,
        "state": state, "run": "r1", "rank": 2, "metric": "loss", "since_step": 20 + i,
        "since_time": 1000.0, "time": 1010.0, "value": float("nan"),
        "message": "rank 2 loss <b>&</b> 8.1 MADs above the median",
    }  # fmt: skip


def test_each_kind_posts_its_documented_message_shape(server: tuple[str, Capture]) -> None:
    base, capture = server
    hooks = Webhooks(
        [
            fast("json", f"{base}/json"),
            fast("slack", f"{base}/slack/{TOKEN}"),
            fast("dingtalk", f"{base}/dingtalk?access_token={TOKEN}", secret=SECRET),
            fast("wecom", f"{base}/wecom?key={TOKEN}"),
            fast("lark", f"{base}/feishu/{TOKEN}", secret=SECRET),
        ]
    )
    hooks.submit(alert())
    wait_for(lambda: len(capture.requests) == 5)
    hooks.close()

    ((_, generic),) = capture.bodies("/json")
    assert generic["alerts"][0]["value"] == "NaN"  # strict JSON, as in JSONL
    assert generic["alerts"][0]["rank"] == 2 and "FIRING" in generic["text"]

    ((_, slack),) = capture.bodies("/slack")
    assert set(slack) == {"text"}
    assert "&lt;b&gt;&amp;&lt;/b&gt;" in slack["text"] and "<b>" not in slack["text"]

    ((path, ding),) = capture.bodies("/dingtalk")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    assert query["access_token"] == [TOKEN]
    ts = query["timestamp"][0]
    expected = base64.b64encode(
        hmac.new(SECRET.encode(), f"{ts}\n{SECRET}".encode(), hashlib.sha256).digest()
    ).decode()
    assert query["sign"] == [expected]
    assert abs(int(ts) / 1000 - time.time()) < 60
    assert ding["msgtype"] == "markdown"
    assert set(ding["markdown"]) == {"title", "text"} and "rank 2" in ding["markdown"]["text"]

    ((_, wecom),) = capture.bodies("/wecom")
    assert wecom["msgtype"] == "markdown" and "loss" in wecom["markdown"]["content"]

    ((_, feishu),) = capture.bodies("/feishu")
    assert feishu["msg_type"] == "text" and "rank 2" in feishu["content"]["text"]
    key = f"{feishu['timestamp']}\n{SECRET}".encode()
    assert feishu["sign"] == base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def test_a_hanging_endpoint_never_slows_submit_and_the_queue_stays_bounded(
    server: tuple[str, Capture],
) -> None:
    base, capture = server
    sink = WebhookSink(WebhookConfig("json", f"{base}/hang", timeout_s=5, queue_max=10))
    healthy = WebhookSink(fast("json", f"{base}/ok", queue_max=1000))
    sink.submit(alert(0))
    wait_for(lambda: len(capture.bodies("/hang")) == 1)  # the thread is stuck in that request
    started = time.perf_counter()
    for i in range(1, 1001):
        sink.submit(alert(i))
        healthy.submit(alert(i))
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"2000 submits took {elapsed:.3f}s"  # microseconds each, not seconds
    assert sink.pending() == 10 and sink.counters["dropped"] == 990
    wait_for(lambda: healthy.counters["alerts_sent"] == 1000)  # the other sink is unaffected
    started = time.perf_counter()
    sink.close(timeout=0.5)
    healthy.close()
    assert time.perf_counter() - started < 2.0


def test_server_errors_are_retried_with_backoff_then_given_up_and_counted(
    server: tuple[str, Capture], caplog: pytest.LogCaptureFixture
) -> None:
    base, capture = server
    caplog.set_level(logging.INFO, logger="rankwatch.webhooks")
    sink = WebhookSink(fast("slack", f"{base}/fail/{TOKEN}", attempts=3))
    sink.submit(alert())
    wait_for(lambda: sink.counters["failed"] == 1)
    sink.close()
    assert len(capture.bodies("/fail")) == 3
    assert sink.counters["retries"] == 2 and sink.counters["last_error"] == "HTTP 500"
    assert sink.counters["sent"] == 0 and sink.counters["alerts_failed"] == 1
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "gave up" in logged and "slack@127.0.0.1" in logged
    assert TOKEN not in logged and "/fail" not in logged


def test_client_errors_and_service_errors_in_the_body(server: tuple[str, Capture]) -> None:
    base, capture = server
    denied = WebhookSink(fast("json", f"{base}/denied", attempts=4))
    badsign = WebhookSink(fast("dingtalk", f"{base}/badsign?access_token=x", attempts=2))
    for sink in (denied, badsign):
        sink.submit(alert())
    wait_for(lambda: denied.counters["failed"] == 1 and badsign.counters["failed"] == 1)
    assert len(capture.bodies("/denied")) == 1  # 403 will not get better: no retry
    assert "310000" in badsign.counters["last_error"]
    assert len(capture.bodies("/badsign")) == 2
    for sink in (denied, badsign):
        sink.close()


def test_rate_limit_coalesces_queued_alerts_into_one_message(
    server: tuple[str, Capture],
) -> None:
    base, capture = server
    sink = WebhookSink(WebhookConfig("json", f"{base}/ok", rate_per_min=120))  # one per 0.5 s
    sink.submit(alert(0))
    wait_for(lambda: len(capture.requests) == 1)
    for i in range(1, 6):
        sink.submit(alert(i, state="resolved"))
    wait_for(lambda: sink.counters["alerts_sent"] == 6)
    sink.close()
    sizes = [len(body["alerts"]) for _, body in capture.requests]
    assert sizes == [1, 5]
    assert "0 firing, 5 resolved" in capture.requests[1][1]["title"]


def test_min_severity_filters(server: tuple[str, Capture]) -> None:
    base, capture = server
    sink = WebhookSink(fast("json", f"{base}/ok", min_severity="critical"))
    sink.submit(alert(0, severity="warning"))
    sink.submit(alert(1, severity="critical"))
    wait_for(lambda: sink.counters["sent"] == 1)
    sink.close()
    assert [b["alerts"][0]["severity"] for _, b in capture.requests] == ["critical"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "teams", "url": "https://x.example/h"}, "unknown webhook kind 'teams'"),
        ({"kind": "slack", "url": "ftp://x.example/h"}, "must be http"),
        ({"kind": "slack", "url": "not a url"}, "must be http"),
        ({"kind": "slack", "url": "https://x.example/h", "min_severity": "loud"}, "min_severity"),
        ({"kind": "slack", "url": "https://x.example/h", "rate_per_min": 0}, "positive"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WebhookConfig(**kwargs)


def test_repr_and_label_hide_url_and_secret() -> None:
    cfg = WebhookConfig("dingtalk", f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}",
                        secret=SECRET)  # fmt: skip
    assert TOKEN not in repr(cfg) and SECRET not in repr(cfg)
    assert cfg.label == "dingtalk@oapi.dingtalk.com"


def test_long_messages_are_clipped_for_chat_services() -> None:
    many = [alert(i) for i in range(200)]
    assert len(build_payload("wecom", many)["markdown"]["content"]) <= 3500
    assert len(build_payload("json", many)["alerts"]) == 200
