"""A real local HTTP server that records what webhooks send it, and helpers around it."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from rankwatch.aggregator.alerts.sinks.http import WebhookConfig


class Capture:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.release = threading.Event()  # lets /hang requests finish at teardown
        self.lock = threading.Lock()

    def bodies(self, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return [(p, b) for p, b in self.requests if p.startswith(prefix)]


@pytest.fixture
def server() -> Iterator[tuple[str, Capture]]:
    capture = Capture()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            with capture.lock:
                capture.requests.append((self.path, body))
            if self.path.startswith("/hang"):
                capture.release.wait(10)
            status, answer = 200, {"errcode": 0, "errmsg": "ok"}
            if self.path.startswith("/fail"):
                status = 500
            elif self.path.startswith("/denied"):
                status = 403
            elif self.path.startswith("/badsign"):
                answer = {"errcode": 310000, "errmsg": "sign not match"}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(OSError):  # a client that timed out has gone
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", capture
    capture.release.set()
    httpd.shutdown()
    httpd.server_close()


def wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def fast(kind: str, url: str, **kw: Any) -> WebhookConfig:
    return WebhookConfig(kind, url, rate_per_min=6000, backoff_s=0.02, timeout_s=2, **kw)
