"""Every response says it may not be framed, and every HTML page (the dashboard, ``/docs``, a
refusal) carries a Content-Security-Policy. ``/docs`` allows its one inline script by hash,
and with that policy the vendored Swagger UI still draws the API in a real Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import create_app

from .conftest import BASE_URL
from .test_live import serve

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    with TestClient(create_app(AggregatorProvider(aggregator)), BASE_URL) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "headers", "status", "html"),
    [
        ("/", {}, 200, True),
        ("/docs", {}, 200, True),
        ("/static/index.html", {}, 200, True),
        ("/static/app.js", {}, 200, False),
        ("/api/runs", {}, 200, False),
        ("/openapi.json", {}, 200, False),
        ("/api/runs", {"Host": "evil.example"}, 403, False),
        ("/nonexistent", {}, 404, False),
    ],
)
def test_every_response_forbids_framing(
    client: TestClient, path: str, headers: dict[str, str], status: int, html: bool
) -> None:
    res = client.get(path, headers=headers)
    assert res.status_code == status
    assert res.headers["x-frame-options"] == "DENY"
    assert res.headers["x-content-type-options"] == "nosniff"
    csp = res.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp
    if html:
        assert "default-src 'self'" in csp and "object-src 'none'" in csp
        assert "unsafe-inline" not in csp.split("script-src", 1)[1].split(";", 1)[0]


def test_docs_allow_only_their_own_inline_script(client: TestClient) -> None:
    csp = client.get("/docs").headers["content-security-policy"]
    script_src = csp.split("script-src ", 1)[1].split(";", 1)[0].split()
    assert script_src[0] == "'self'" and len(script_src) == 2
    assert script_src[1].startswith("'sha256-")
    assert "cdn" not in client.get("/docs").text.lower()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")
def test_docs_draw_under_their_policy(aggregator: Any) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    with (
        serve(create_app(AggregatorProvider(aggregator))) as base,
        sync_api.sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            refused: list[str] = []
            page.on(
                "console",
                lambda m: refused.append(m.text) if "Content Security" in m.text else None,
            )
            page.goto(base + "/docs")
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)
            assert "/api/runs" in page.inner_text("#swagger-ui")
            assert refused == []
        finally:
            browser.close()
