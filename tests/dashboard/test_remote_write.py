"""The remote writer against a real local HTTP server: the body it posts, a store that is down
(one line, counted, no backlog), one that comes back; and the config's check of the URL."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest
from rankwatch.aggregator.config import ConfigError, with_overrides
from rankwatch.aggregator.settings import ServeConfig
from rankwatch.dashboard.remote_write import RemoteWriter


class Store(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(body)
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def store() -> Iterator[str]:
    Store.bodies, Store.status = [], 204
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/import/prometheus"
    server.shutdown()
    server.server_close()


def test_pushes_the_exposition_and_says_once_when_the_store_fails(store: str) -> None:
    said: list[str] = []
    values = iter(range(100))
    writer = RemoteWriter(store, lambda: f"rankwatch_x {next(values)}\n", 60.0, said.append)
    assert writer.push()
    assert Store.bodies == [b"rankwatch_x 0\n"]
    Store.status = 500
    assert not writer.push() and not writer.push()
    assert said == [f"rankwatch: remote write to {store} failed: HTTP 500 (retrying)"]
    Store.status = 204
    assert writer.push()
    assert said[-1] == f"rankwatch: remote write to {store} works again"
    assert (writer.counts.pushes, writer.counts.failures) == (2, 2)
    assert Store.bodies[-1] == b"rankwatch_x 3\n"  # the current values, no backlog of old ones


def test_stop_pushes_the_final_state(store: str) -> None:
    writer = RemoteWriter(store, lambda: "rankwatch_x 1\n", 3600.0, lambda _: None)
    writer.start()
    writer.stop()
    assert Store.bodies == [b"rankwatch_x 1\n"]


def test_an_unreachable_store_is_a_counted_failure() -> None:
    said: list[str] = []
    writer = RemoteWriter("http://127.0.0.1:9/x", lambda: "", 60.0, said.append)
    assert not writer.push()
    assert writer.counts.failures == 1 and "failed" in said[0]


@pytest.mark.parametrize("url", ["victoria:8428", "ftp://h/x", "http:///x", "http://"])
def test_a_bad_url_is_refused_with_an_example(url: str) -> None:
    with pytest.raises(ConfigError, match=r"not an http\(s\) URL with a host, e\.g\. http://"):
        with_overrides(ServeConfig(), remote_write=url)
