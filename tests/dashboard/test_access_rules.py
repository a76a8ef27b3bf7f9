"""Host, Origin, content type and HTTP ingest on/off, through the real app (``TestClient``):
each refusal answered with its status and the words a person reads, and counted on /metrics.
The rule itself (``access.decide``) as a table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.access import Access, decide, host_name
from rankwatch.dashboard.app import create_app

from .conftest import BASE_URL, Records, settle

RECORD_JSON = '{"records": []}'
SERVER = Access.for_server("0.0.0.0", names=("head-node",), allowed=("rw.example.org",))


@pytest.fixture
def client(aggregator: Any, recs: Records) -> Iterator[TestClient]:
    aggregator.add([recs.step("r", 0, 1, 1, loss=1.0)])
    settle(aggregator)
    with TestClient(create_app(AggregatorProvider(aggregator), access=SERVER), BASE_URL) as c:
        yield c


def _refused_counts(client: TestClient) -> dict[str, int]:
    text = client.get("/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("rankwatch_aggregator_http_refused{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = int(float(line.rsplit(" ", 1)[1]))
    return out


def test_a_foreign_host_is_refused_with_the_option_named(client: TestClient) -> None:
    res = client.get("/api/runs", headers={"Host": "attacker.example:8670"})
    assert res.status_code == 403
    detail = res.json()["detail"]
    assert "'attacker.example'" in detail
    assert "rankwatch serve --allow-host attacker.example" in detail
    assert "DNS rebinding" in detail
    assert client.get("/", headers={"Host": "attacker.example"}).status_code == 403
    assert _refused_counts(client)["host"] == 2


@pytest.mark.parametrize(
    "host",
    ["localhost:8670", "127.0.0.1:8670", "[::1]:8670", "10.1.2.3", "head-node:8670",
     "RW.example.org", "rw.example.org."],
)  # fmt: skip
def test_names_the_server_answers_to(client: TestClient, host: str) -> None:
    assert client.get("/api/runs", headers={"Host": host}).status_code == 200


def test_healthz_answers_any_host(client: TestClient) -> None:
    assert client.get("/healthz", headers={"Host": "kube-probe.internal"}).status_code == 200


def test_a_cross_site_text_plain_post_is_refused(client: TestClient) -> None:
    # what a form or fetch() on any page the operator visits can send without a preflight
    res = client.post(
        "/api/ingest",
        content=RECORD_JSON,
        headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
    )
    assert res.status_code == 403
    assert res.json()["detail"].startswith(
        "cross-site request refused: it comes from https://evil.example, not from this "
        "server's own page (localhost)"
    )


def test_a_post_that_is_not_json_is_refused(client: TestClient) -> None:
    res = client.post("/api/ingest", content=RECORD_JSON, headers={"Content-Type": "text/plain"})
    assert res.status_code == 415
    assert res.json()["detail"] == (
        "POST /api/ingest takes Content-Type: application/json (got 'text/plain')"
    )
    res = client.post("/api/ingest", content=RECORD_JSON)
    assert res.status_code == 415 and res.json()["detail"].endswith("(got none)")
    ok = client.post(
        "/api/ingest",
        content=RECORD_JSON,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200
    assert _refused_counts(client)["content_type"] == 2


def test_a_foreign_origin_cannot_read_the_api(client: TestClient) -> None:
    res = client.get("/api/status", headers={"Origin": "http://evil.example:8670"})
    assert res.status_code == 403 and "evil.example" in res.json()["detail"]
    res = client.get("/api/runs", headers={"Sec-Fetch-Site": "cross-site"})
    assert res.status_code == 403
    assert "another site (Sec-Fetch-Site)" in res.json()["detail"]
    assert _refused_counts(client)["origin"] == 2
    # the page's own requests: same origin, or a proxy's public name the operator allowed
    assert client.get("/api/status", headers={"Origin": "http://localhost"}).status_code == 200
    own = {"Origin": "https://rw.example.org", "Host": "127.0.0.1:8670"}
    assert client.get("/api/status", headers=own).status_code == 200
    # a link from elsewhere still opens the page itself
    assert client.get("/", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


def test_http_ingest_can_be_off(aggregator: Any) -> None:
    access = Access.for_server("127.0.0.1", ingest_off="HTTP ingest is off: use CurveZMQ")
    with TestClient(create_app(AggregatorProvider(aggregator), access=access), BASE_URL) as c:
        res = c.post("/api/ingest", json={"records": []})
        assert res.status_code == 403
        assert res.json()["detail"] == "HTTP ingest is off: use CurveZMQ"
        assert c.get("/api/status").status_code == 200  # reading is not ingest


def test_a_star_allows_any_host(aggregator: Any) -> None:
    access = Access.for_server("0.0.0.0", allowed=["*"])
    with TestClient(create_app(AggregatorProvider(aggregator), access=access), BASE_URL) as c:
        assert c.get("/api/runs", headers={"Host": "anything.example"}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "headers", "want"),
    [
        ("GET", "/api/runs", {"host": "localhost"}, None),
        ("GET", "/api/runs", {}, "host"),  # no Host at all: not a name we answer to
        ("GET", "/static/app.js", {"host": "evil.example"}, "host"),
        ("GET", "/healthz", {"host": "evil.example"}, None),
        ("GET", "/", {"host": "localhost", "origin": "http://evil.example"}, None),
        ("GET", "/openapi.json", {"host": "localhost", "origin": "null"}, "origin"),
        ("POST", "/api/ingest", {"host": "localhost", "origin": "null"}, "origin"),
        ("POST", "/api/ingest", {"host": "localhost:1", "origin": "http://localhost:2"}, "origin"),
        ("POST", "/api/ingest", {"host": "localhost", "content-type": "text/plain"},
         "content_type"),
        ("POST", "/api/ingest", {"host": "localhost", "content-type": "application/json"}, None),
        ("PUT", "/anything", {"host": "localhost", "content-type": "multipart/form-data"},
         "content_type"),
    ],
)  # fmt: skip
def test_decide(method: str, path: str, headers: dict[str, str], want: str | None) -> None:
    refusal = decide(method, path, headers, Access())
    assert (refusal.reason if refusal else None) == want


def test_host_name() -> None:
    assert host_name("Example.ORG:8670") == "example.org"
    assert host_name("[::1]:8670") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("head.") == "head"
