"""`rankwatch serve --token`: every route of the real app needs it, except /healthz."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import create_app

from .conftest import BASE_URL, Records, settle

TOKEN = "tok-3f9a"
PROTECTED = [
    "/",
    "/static/app.js",
    "/static/vendor/echarts.min.js",
    "/docs",
    "/openapi.json",
    "/api/runs",
    "/api/status",
    "/api/alerts",
    "/api/runs/r/series?metric=loss",
    "/api/runs/r/heatmap?metric=loss",
    "/api/stream",
    "/metrics",
    "/does-not-exist",
]


@pytest.fixture
def client(aggregator: Any, recs: Records) -> Iterator[TestClient]:
    aggregator.add([recs.step("r", 0, 1, 1, loss=1.0)])
    settle(aggregator)
    with TestClient(
        create_app(AggregatorProvider(aggregator), token=TOKEN), base_url=BASE_URL
    ) as c:
        yield c


@pytest.mark.parametrize("path", PROTECTED)
def test_every_route_needs_the_token(client: TestClient, path: str) -> None:
    res = client.get(path)
    assert res.status_code == 401
    assert res.headers["www-authenticate"].startswith("Bearer")
    wrong = client.get(path, headers={"Authorization": "Bearer tok-3f9b"})
    assert wrong.status_code == 401


@pytest.mark.parametrize(
    "path", [p for p in PROTECTED if p not in ("/api/stream", "/does-not-exist")]
)
def test_bearer_token_opens_them(client: TestClient, path: str) -> None:
    assert client.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_post_ingest_needs_the_token(client: TestClient) -> None:
    assert client.post("/api/ingest", json={"records": []}).status_code == 401
    ok = client.post(
        "/api/ingest", json={"records": []}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert ok.status_code == 200


def test_healthz_is_open(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200


def test_page_link_with_token_sets_a_cookie_for_the_rest(client: TestClient) -> None:
    page = client.get("/", params={"token": TOKEN})
    assert page.status_code == 200
    assert "HttpOnly" in page.headers["set-cookie"]
    # what the page does next: its scripts and API reads carry only the cookie
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/api/runs").json()["runs"][0]["run"] == "r"
