"""The socket ``rankwatch serve`` listens on: every accepted connection has TCP_NODELAY (else a
small response waits for the client's delayed ACK, ~40 ms per keep-alive request). Checked on
the server's side of a real connection, under uvicorn, with getsockopt."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.cli.serve import listen_socket
from rankwatch.dashboard.app import create_app

START_TIMEOUT_S = 10.0


@contextmanager
def running(app: Any, sock: socket.socket) -> Iterator[uvicorn.Server]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
        sock.close()


def _nodelay_of_accepted(server: uvicorn.Server) -> list[int]:
    out = []
    for protocol in list(server.server_state.connections):
        accepted = protocol.transport.get_extra_info("socket")
        out.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    return out


def test_accepted_connections_have_tcp_nodelay(aggregator: Any) -> None:
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with running(create_app(AggregatorProvider(aggregator)), sock) as server:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=START_TIMEOUT_S)
        try:
            for _ in range(2):  # the same keep-alive connection twice
                conn.request("GET", "/api/status")
                res = conn.getresponse()
                assert res.status == 200
                res.read()
            flags = _nodelay_of_accepted(server)
        finally:
            conn.close()
    assert len(flags) == 1 and flags[0] != 0
