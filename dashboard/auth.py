"""Optional shared-token protection for every route (``rankwatch serve --token``).

The token may come as ``Authorization: Bearer <token>`` (scripts, ``rankwatch status``),
as ``?token=<token>`` (the first page load, a link someone was given) or as the cookie that
a successful ``?token=`` sets, so the page's own fetches and its EventSource carry it without
putting it in every URL. Comparison is constant-time.

It is a plain ASGI middleware rather than a FastAPI dependency so that it also guards the
static files, the OpenAPI docs and the Server-Sent Events stream, and never buffers a response.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, quote, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE_NAME = "rankwatch_token"
COOKIE_MAX_AGE_S = 7 * 24 * 3600  # a week: long enough for a training run, not forever
OPEN_PATHS = frozenset({"/healthz"})  # liveness probes carry no credentials


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def presented_tokens(scope: Scope) -> tuple[list[str], bool]:
    """Every token the request carries, and whether one came in the query string."""
    found: list[str] = []
    auth = _header(scope, b"authorization")
    if auth and auth[:7].lower() == "bearer ":
        found.append(auth[7:].strip())
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    from_query = query.get("token", [])
    found.extend(from_query)
    cookie_header = _header(scope, b"cookie")
    if cookie_header:
        cookie: SimpleCookie = SimpleCookie()
        try:
            cookie.load(cookie_header)
        except Exception:  # a malformed Cookie header is the client's problem, not a 500
            cookie = SimpleCookie()
        if COOKIE_NAME in cookie:
            found.append(unquote(cookie[COOKIE_NAME].value))
    return found, bool(from_query)


def token_matches(expected: str, candidates: Iterable[str]) -> bool:
    want = expected.encode("utf-8")
    ok = False
    for candidate in candidates:
        # Check all of them so the time taken does not depend on which one matched.
        ok |= hmac.compare_digest(want, candidate.encode("utf-8", "replace"))
    return ok


class TokenGuard:
    """Rejects requests without the token with 401; sets the cookie after a ``?token=`` load."""

    def __init__(self, app: ASGIApp, token: str, open_paths: Iterable[str] = OPEN_PATHS) -> None:
        if not token:
            raise ValueError("an empty token would protect nothing; pass None to disable")
        self.app = app
        self.token = token
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # there are none; refuse rather than pass unguarded
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        candidates, from_query = presented_tokens(scope)
        if not token_matches(self.token, candidates):
            await _unauthorized(send, bool(candidates))
            return
        if not from_query:
            await self.app(scope, receive, send)
            return

        secure = scope.get("scheme") == "https"

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                value = quote(self.token, safe="")
                cookie = (
                    f"{COOKIE_NAME}={value}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; "
                    "HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
                )
                headers = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


async def _unauthorized(send: Send, had_token: bool) -> None:
    detail = (
        "wrong token"
        if had_token
        else "this rankwatch server needs a token: "
        "send 'Authorization: Bearer <token>' or open the page with ?token=<token>"
    )
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="rankwatch"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
