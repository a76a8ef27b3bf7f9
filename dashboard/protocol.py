"""uvicorn's h11 protocol with an answer for a request head that is too large.

uvicorn answers any malformed request, an oversized URL or header included, with a bare 400
and closes the connection at once, while the client may still be sending: the unread bytes make
the kernel reset the connection, and the client sees "connection reset" instead of an answer.
Here a head over ``MAX_HEAD_BYTES`` is answered 414 (the request line is that long) or 431 (the
headers are), with a line saying so, and the connection is closed the way RFC 9112 section 9.6
asks: our side first, then what the client still sends is read and dropped for up to
``LINGER_S`` (and ``LINGER_BYTES``), so the answer arrives before the close.

Use it as ``uvicorn.Config(app, http=HeadLimitedH11Protocol, h11_max_incomplete_event_size=
MAX_HEAD_BYTES)`` (``server_options()``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# The request line plus headers. The API's longest legitimate URL (a run name of 1,024
# characters percent-encoded, a 4,000-character rank list) is well under it.
MAX_HEAD_BYTES = 64 * 1024
LINGER_S = 2.0
LINGER_BYTES = 16 * 1024 * 1024


class _Connection(h11.Connection):
    """Remembers why the request could not be parsed, and whether its first line ended."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.error: h11.RemoteProtocolError | None = None
        self.line_ended = False

    def receive_data(self, data: bytes) -> None:
        if not self.line_ended and b"\n" in data:
            self.line_ended = True
        super().receive_data(data)

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.line_ended = False  # the next request's line is read from here


class HeadLimitedH11Protocol(H11Protocol):
    def __init__(self, config: Any, *args: Any, **kw: Any) -> None:
        super().__init__(config, *args, **kw)
        limit = config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
        self.head_limit = limit
        self.conn = _Connection(h11.SERVER, limit)
        self._dropped: int | None = None  # bytes read and dropped since our side closed

    def data_received(self, data: bytes) -> None:
        if self._dropped is None:
            super().data_received(data)
            return
        self._dropped += len(data)
        if self._dropped > LINGER_BYTES:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        conn = self.conn
        assert isinstance(conn, _Connection)  # set in __init__; uvicorn never replaces it
        too_long = conn.error is not None and conn.error.error_status_hint == 431
        if not too_long:
            super().send_400_response(msg)
            return
        if conn.line_ended:
            status, text = 431, f"request headers over {self.head_limit} bytes"
        else:
            status, text = 414, f"URL over {self.head_limit} bytes"
        body = f"{text}: this server reads at most {self.head_limit} bytes of request head\n"
        head = (
            f"HTTP/1.1 {status} {h11_reason(status)}\r\n"
            "content-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        # Written directly: h11 refuses to send once it has seen the client's protocol error.
        self.transport.write(head.encode() + body.encode())
        self._dropped = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def h11_reason(status: int) -> str:
    return {414: "URI Too Long", 431: "Request Header Fields Too Large"}.get(status, "")


def server_options() -> dict[str, Any]:
    """``uvicorn.Config`` keywords for the dashboard's HTTP server."""
    return {"http": HeadLimitedH11Protocol, "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
