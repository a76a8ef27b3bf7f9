"""A budget on request body bytes in flight, so a few large POSTs cannot take the memory.

A JSON body costs several times its size while it is parsed and decoded (the bytes, the parsed
objects, the records), and nothing else bounded how many bodies were in that state at once.
Each request whose body is over ``SMALL_BODY_BYTES`` reserves its declared length from one
budget for as long as it is handled; when the budget cannot cover it, the answer is 503 with
``Retry-After`` at once, before any of the body is read. A body without a length reserves the
most an ingest body may be. Small bodies (the page, ``rankwatch status``) never wait for this.
Everything runs on the event loop, so the budget is a plain counter.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from .ingest import MAX_INGEST_BYTES

BODY_BUDGET_BYTES = MAX_INGEST_BYTES  # large bodies in flight at once, in total
SMALL_BODY_BYTES = 1024 * 1024  # bodies up to this size are not counted
RETRY_AFTER_S = 2


class Bodies:
    """The budget's state, shared by the middleware and /metrics."""

    def __init__(self, budget_bytes: int = BODY_BUDGET_BYTES, small: int = SMALL_BODY_BYTES):
        self.budget = budget_bytes
        self.small = small
        self.in_flight = 0
        self.refused = 0

    def counters(self) -> dict[str, int]:
        return {"http_body_bytes_in_flight": self.in_flight, "http_bodies_refused": self.refused}

    def size(self, scope: Scope) -> int:
        """Bytes to reserve for this request: 0 for a small or absent body."""
        declared = None
        chunked = False
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                declared = value
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if declared is not None and declared.isdigit():
            size = int(declared)
        elif chunked:
            size = MAX_INGEST_BYTES  # no length: as much as a body may grow to
        else:
            return 0
        # a body larger than the budget is refused by its route (413), not made to wait forever
        return min(size, self.budget) if size > self.small else 0


class BodyBudget:
    """ASGI middleware over ``Bodies``."""

    def __init__(self, app: ASGIApp, bodies: Bodies) -> None:
        self.app = app
        self.bodies = bodies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        bodies = self.bodies
        size = bodies.size(scope) if scope["type"] == "http" else 0
        if not size:
            await self.app(scope, receive, send)
            return
        if bodies.in_flight + size > bodies.budget:
            bodies.refused += 1
            await _busy(send, size, bodies.in_flight, bodies.budget)
            return
        bodies.in_flight += size
        try:
            await self.app(scope, receive, send)
        finally:
            bodies.in_flight -= size


async def _busy(send: Send, size: int, in_flight: int, budget: int) -> None:
    detail = (
        f"busy: {in_flight} bytes of request bodies are being handled and this one adds "
        f"{size} (at most {budget} at once); send it again in {RETRY_AFTER_S} s, or in "
        "smaller batches"
    )
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
