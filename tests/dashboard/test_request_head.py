"""An oversized URL or header gets 414 or 431 with a line saying why, not a reset connection:
the dashboard's HTTP protocol under a real uvicorn on 127.0.0.1 (port 0), raw sockets that
send the whole request before they read, as curl and most clients do."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.cli.serve import listen_socket
from rankwatch.dashboard.app import create_app
from rankwatch.dashboard.protocol import MAX_HEAD_BYTES, server_options

TIMEOUT_S = 10.0


@contextmanager
def served(app: Any) -> Iterator[int]:
    sock = listen_socket("127.0.0.1", 0)
    config = uvicorn.Config(app, log_level="error", lifespan="on", **server_options())
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)
        sock.close()


def exchange(port: int, request: bytes) -> bytes:
    """Send all of ``request``, then read the answer to the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


@pytest.mark.parametrize(
    ("request_bytes", "status", "words"),
    [
        (b"GET /api/runs?x=" + b"a" * 300_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
         b"414 URI Too Long", b"URL over"),
        (b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n",
         b"431 Request Header Fields Too Large", b"request headers over"),
        (b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\n"
         + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 1000) for i in range(4000)) + b"\r\n",
         b"431 Request Header Fields Too Large", b"request headers over"),
    ],
)  # fmt: skip
def test_an_oversized_head_is_answered(
    aggregator: Any, request_bytes: bytes, status: bytes, words: bytes
) -> None:
    with served(create_app(AggregatorProvider(aggregator))) as port:
        answer = exchange(port, request_bytes)
        assert answer.startswith(b"HTTP/1.1 " + status + b"\r\n"), answer[:200]
        body = answer.split(b"\r\n\r\n", 1)[1]
        assert (
            body
            == words
            + b" %d bytes: this server reads at most %d bytes of request head\n"
            % (MAX_HEAD_BYTES, MAX_HEAD_BYTES)
        )
        # the server goes on answering
        ok = exchange(
            port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        assert ok.startswith(b"HTTP/1.1 200 OK")


def test_a_malformed_request_is_still_a_400(aggregator: Any) -> None:
    with served(create_app(AggregatorProvider(aggregator))) as port:
        answer = exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ")
