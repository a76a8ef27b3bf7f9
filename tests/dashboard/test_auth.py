"""TokenGuard on a tiny app: header, query and cookie tokens; constant-time compare."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from rankwatch.dashboard.auth import COOKIE_NAME, TokenGuard, token_matches

TOKEN = "s3cret;with=odd chars"


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/api/x")
    def x() -> dict[str, int]:
        return {"x": 1}

    app.add_middleware(TokenGuard, token=TOKEN)
    return TestClient(app)


def test_rejects_without_token(client: TestClient) -> None:
    res = client.get("/api/x")
    assert res.status_code == 401
    assert "needs a token" in res.json()["detail"]
    assert res.headers["www-authenticate"].startswith("Bearer")


def test_rejects_wrong_token(client: TestClient) -> None:
    res = client.get("/api/x", headers={"Authorization": "Bearer nope"})
    assert res.status_code == 401
    assert res.json()["detail"] == "wrong token"


def test_healthz_stays_open(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200


def test_bearer_header(client: TestClient) -> None:
    res = client.get("/api/x", headers={"Authorization": f"Bearer {TOKEN}"})
    assert res.status_code == 200
    assert "set-cookie" not in res.headers


def test_query_token_sets_cookie_that_then_suffices(client: TestClient) -> None:
    res = client.get("/api/x", params={"token": TOKEN})
    assert res.status_code == 200
    cookie = res.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    # the TestClient keeps cookies like a browser: the next request needs nothing else
    assert client.get("/api/x").status_code == 200


def test_bad_cookie_header_is_401_not_500(client: TestClient) -> None:
    res = client.get("/api/x", headers={"Cookie": 'a="unterminated; b'})
    assert res.status_code == 401


def test_empty_token_refused() -> None:
    with pytest.raises(ValueError, match="empty token"):
        TokenGuard(FastAPI(), token="")


@pytest.mark.parametrize(
    ("candidates", "ok"),
    [([], False), (["x"], False), (["x", TOKEN], True), ([TOKEN[:-1]], False)],
)
def test_token_matches(candidates: list[str], ok: bool) -> None:
    assert token_matches(TOKEN, candidates) is ok
