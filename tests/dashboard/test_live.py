"""Server-Sent Events: LiveHub over a real Feed, and /api/stream over a real uvicorn socket."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from rankwatch.aggregator.feed import Feed
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard import live
from rankwatch.dashboard.app import create_app
from rankwatch.dashboard.live import LiveHub

from .conftest import Records

READ_TIMEOUT_S = 10.0
NAN = float("nan")


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + READ_TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(READ_TIMEOUT_S)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs from SSE lines; comments come out as ("comment", text)."""
    event, data = "message", []
    for line in lines:
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []


@pytest.fixture
def http(aggregator: Any) -> Iterator[httpx.Client]:
    """An HTTP client whose base URL is the dashboard served over a real socket."""
    with (
        serve(create_app(AggregatorProvider(aggregator))) as base,
        httpx.Client(base_url=base, timeout=READ_TIMEOUT_S) as client,
    ):
        yield client


def test_stream_pushes_points_of_the_run(
    http: httpx.Client, aggregator: Any, recs: Records
) -> None:
    with http.stream("GET", "/api/stream", params={"run": "a"}) as res:
        assert res.headers["content-type"].startswith("text/event-stream")
        stream = events(res.iter_lines())
        assert next(stream) == ("hello", '{"run":"a"}')
        aggregator.add(
            [recs.step("b", 0, 1, 1, loss=9.0)]
            + [recs.step("a", r, 1, 2, loss=1.0 + r, extra=float("nan")) for r in (0, 1)]
        )
        aggregator.tick()
        points: dict[str, list[Any]] = {}
        while len(points) < 2:  # the messages of one tick may come in more than one frame
            kind, data = next(stream)
            assert kind == "feed"
            messages = json.loads(data, parse_constant=pytest.fail)  # NaN came as a string
            assert {m["run"] for m in messages} == {"a"}
            points.update((m["metric"], m["points"]) for m in messages if m["type"] == "points")
        assert sorted(points["loss"]) == [[0, 1, 1.0], [1, 1, 2.0]]
        assert sorted(points["extra"]) == [[0, 1, "NaN"], [1, 1, "NaN"]]


def test_stream_says_closed_when_the_aggregator_stops(http: httpx.Client, aggregator: Any) -> None:
    with http.stream("GET", "/api/stream") as res:
        stream = events(res.iter_lines())
        assert next(stream)[0] == "hello"
        aggregator.stop()  # closes the feed
        assert next(stream)[0] == "closed"
        assert next(stream, None) is None  # and the response ends


async def _take(gen: AsyncIterator[bytes], n: int) -> list[str]:
    return [(await asyncio.wait_for(gen.__anext__(), READ_TIMEOUT_S)).decode() for _ in range(n)]


def test_heartbeat_when_quiet() -> None:
    async def scenario() -> list[str]:
        hub = LiveHub(Feed(), heartbeat_s=0.05)
        hub.start()
        gen = hub.stream()
        try:
            return await _take(gen, 3)
        finally:
            await gen.aclose()
            assert hub.clients == 0  # the subscription was released

    hello, ping1, ping2 = asyncio.run(scenario())
    assert "event: hello" in hello
    assert ping1 == ping2 == ": ping\n\n"


def test_resync_when_the_browser_lags() -> None:
    async def scenario() -> list[str]:
        feed = Feed(queue_max=3)
        hub = LiveHub(feed)
        hub.start()
        gen = hub.stream("r")
        try:
            first = await _take(gen, 1)
            for step in range(10):  # more than the subscriber's queue holds
                feed.publish(
                    {"type": "points", "run": "r", "metric": "m", "points": [[0, step, 1]]}
                )
            return first + await _take(gen, 2)
        finally:
            await gen.aclose()

    _, resync, feed_frame = asyncio.run(scenario())
    assert resync.startswith("event: resync\n")
    assert json.loads(resync.split("data: ", 1)[1]) == {"dropped": 7}
    kept = json.loads(feed_frame.split("data: ", 1)[1])
    assert [m["points"][0][1] for m in kept] == [7, 8, 9]


def test_hub_stop_ends_open_streams() -> None:
    async def scenario() -> list[str]:
        hub = LiveHub(Feed())
        hub.start()
        gen = hub.stream()
        out = await _take(gen, 1)
        hub.stop()  # what the app's lifespan does on shutdown
        out += await _take(gen, 1)
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        return out

    hello, closed = asyncio.run(scenario())
    assert "event: hello" in hello and "event: closed" in closed


def test_stream_before_start_says_closed() -> None:
    async def scenario() -> list[str]:
        gen = LiveHub(Feed()).stream()
        return [chunk.decode() async for chunk in gen]

    assert asyncio.run(scenario()) == ['event: closed\ndata: {"reason":"server stopping"}\n\n']


@pytest.mark.parametrize("shared_chars", [live.SHARED_JSON_CHARS, 1])
def test_streams_share_each_message_json(
    monkeypatch: pytest.MonkeyPatch, shared_chars: int
) -> None:
    # 1 character: nothing is kept for the other streams, and they encode their own
    monkeypatch.setattr(live, "SHARED_JSON_CHARS", shared_chars)
    messages = [
        {"type": "points", "run": "r", "metric": "loss", "points": [[0, 1, 2.5], [1, 1, NAN]]},
        {"type": "points", "run": "other", "metric": "loss", "points": [[0, 1, 3.0]]},
        {"type": "alert", "state": "firing", "message": "rank 1 loss is NaN"},  # no run: to all
    ]

    async def scenario() -> tuple[list[list[str]], int]:
        feed = Feed()
        hub = LiveHub(feed)
        hub.start()
        gens = [hub.stream("r") for _ in range(3)] + [hub.stream()]
        try:
            for gen in gens:
                await _take(gen, 1)  # hello: subscribed
            for message in messages:
                feed.publish(message)
            return [await _take(gen, 1) for gen in gens], hub.encoded
        finally:
            for gen in gens:
                await gen.aclose()

    frames, encoded = asyncio.run(scenario())
    data = [[json.loads(f.split("data: ", 1)[1]) for f in got] for got in frames]
    strict = json.loads(live.dumps(messages[0]))  # NaN as "NaN", the page's convention
    assert strict["points"][1][2] == "NaN"
    assert data[:3] == [[[strict, messages[2]]]] * 3
    assert data[3] == [[strict, messages[1], messages[2]]]
    assert messages[0]["points"][1][2] is NAN  # the feed's message itself is left as it was
    # each message once when the JSON is shared; per stream that sends it when it is not
    assert encoded == (3 if shared_chars > 1 else 2 * 3 + 3)
