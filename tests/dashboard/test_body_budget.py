"""Large request bodies share one budget of bytes in flight: beyond it a request is answered
503 with Retry-After before its body is read, small requests still pass, and the budget comes
back when a request ends (even one whose client went away). Real uvicorn, raw sockets."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard import bodies
from rankwatch.dashboard.app import create_app

from .test_live import READ_TIMEOUT_S, serve

BIG = 40 * 1024 * 1024


def _start_post(port: int, length: int, first: bytes) -> socket.socket:
    """A POST /api/ingest that declares ``length`` bytes and sends only ``first`` of them."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
    head = (
        f"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + first)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before an answer"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(body)


def _gauge(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f"rankwatch_aggregator_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_large_bodies_beyond_the_budget_are_answered_503(aggregator: Any) -> None:
    with (
        serve(create_app(AggregatorProvider(aggregator))) as base,
        httpx.Client(base_url=base, timeout=READ_TIMEOUT_S) as http,
    ):
        port = int(base.rsplit(":", 1)[1])
        first = _start_post(port, BIG, b'{"records": [')  # held open: 40 MB reserved
        deadline = time.monotonic() + READ_TIMEOUT_S
        while _gauge(http, "http_body_bytes_in_flight") < BIG:
            assert time.monotonic() < deadline, "the first body was never counted"
            time.sleep(0.02)
        second = _start_post(port, BIG, b"")
        status, headers, body = _answer(second)
        second.close()
        assert status == 503
        assert headers["retry-after"] == str(bodies.RETRY_AFTER_S)
        assert body["detail"] == (
            f"busy: {BIG} bytes of request bodies are being handled and this one adds {BIG} "
            f"(at most {bodies.BODY_BUDGET_BYTES} at once); send it again in 2 s, or in "
            "smaller batches"
        )
        # small requests do not wait for the budget
        assert http.post("/api/ingest", json={"records": []}).status_code == 200
        assert http.get("/api/status").status_code == 200
        first.close()  # the client goes away mid-body: its reservation must come back
        deadline = time.monotonic() + READ_TIMEOUT_S
        while _gauge(http, "http_body_bytes_in_flight") > 0:
            assert time.monotonic() < deadline, "the budget did not come back"
            time.sleep(0.02)
        assert _gauge(http, "http_bodies_refused") == 1
        records = json.dumps({"records": [{"pad": "x" * 1000}] * 2000}).encode()  # ~2 MB
        assert len(records) > bodies.SMALL_BODY_BYTES
        res = http.post(
            "/api/ingest", content=records, headers={"Content-Type": "application/json"}
        )
        assert res.status_code == 200 and res.json()["received"] == 2000
