"""Server-Sent Events: the aggregator's live feed pushed to the page.

Each ``GET /api/stream`` subscribes to the provider's live feed and forwards what arrives as
``event: feed`` frames, a JSON array of feed messages per frame: increments arrive in bursts
(one ``points`` message per metric per step), and one frame per burst keeps the browser's work
per redraw small. A comment line goes out when nothing happened for a while so proxies keep the
connection open and the page can tell a quiet run from a dead connection. When the subscription
dropped messages because the browser lagged, a ``resync`` event tells the page to re-read the
REST views instead of drawing a series with holes in it.

Rank tables go out as what changed: the aggregator re-sends a live run's whole table every
couple of seconds, and a page that already has it needs only the ranks that differ. Each stream
sends a run's first table whole, then ``{"type": "ranks", "delta": true, "ranks": [changed
entries], "removed": [ranks]}`` and nothing at all while nothing changed, so a run that is over
costs its page nothing after its last change (``feed.ranks_delta``). Streams that saw the same
tables share one delta and its JSON.

Every stream gets the same message objects from the feed, so a message is encoded once, by the
first stream that sends it, and the others reuse its JSON (``LiveHub._json``): at thousands of
ranks encoding is a visible share of the aggregator's CPU per open page (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from rankwatch.aggregator.provider import FeedClosed, Subscription, ranks_delta

from .jsonenc import dumps, dumps_fast

HEARTBEAT_INTERVAL_S = 10.0  # comment line after this long without a message
COALESCE_S = 0.03  # after the first message, wait this long for the rest of its burst
MAX_BATCH = 500  # feed messages in one SSE frame
CLIENT_RETRY_MS = 2000  # EventSource reconnect delay the browser is told to use
# An open stream never ends by itself, and uvicorn waits for open responses before it runs the
# lifespan shutdown: the server must bound that wait (uvicorn's timeout_graceful_shutdown).
SHUTDOWN_GRACE_S = 2  # whole seconds: uvicorn takes an int
# JSON of recent messages kept for the other streams (characters; the messages are kept too):
# streams send a message within ~COALESCE_S of each other unless one lags, and a lagging one
# encodes its own. 2 M: ~6 steps of 4,096 ranks x 5 metrics, ~10 MB with the messages held.
SHARED_JSON_CHARS = 2_000_000
SHARED_DELTAS = 256  # (previous table, new table) pairs whose delta message is kept


class FeedSource(Protocol):
    """Where the live feed comes from: a ``DataProvider``, or a bare ``Feed`` in tests."""

    def subscribe(self) -> Subscription: ...


def sse(event: str, data: str) -> bytes:
    # json.dumps never emits a raw newline, so one "data:" line holds the whole payload.
    return f"event: {event}\ndata: {data}\n\n".encode()


class LiveHub:
    """Owns the stream subscriptions so the app's lifespan can end them all on shutdown."""

    def __init__(self, feed: FeedSource, heartbeat_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.feed = feed
        self.heartbeat_s = heartbeat_s
        self._subs: set[Subscription] = set()
        self._running = False
        self.frames_sent = 0
        self.encoded = 0  # messages encoded to JSON (once each, however many streams send them)
        # id(message) -> (message, its JSON); holding the message keeps its id from being reused
        self._json_of: OrderedDict[int, tuple[dict[str, Any], str]] = OrderedDict()
        self._json_chars = 0
        # (id(previous table message), id(new one)) -> (both messages, the delta or None)
        self._deltas: OrderedDict[tuple[int, int], tuple[Any, Any, dict[str, Any] | None]] = (
            OrderedDict()
        )
        self.ranks_unchanged = 0  # rank tables not sent because nothing in them changed

    def start(self) -> None:
        self._running = True

    def stop(self) -> None:
        """Close every open stream's subscription: each generator then ends its response."""
        self._running = False
        for sub in list(self._subs):
            sub.close()
        self._subs.clear()

    @property
    def clients(self) -> int:
        return len(self._subs)

    async def stream(self, run: str | None = None, tables: bool = True) -> AsyncIterator[bytes]:
        """The body of one SSE response, filtered to ``run`` when given. ``tables=False``: a
        rank table goes out as how many of its ranks changed (``{"type": "ranks", "changed":
        n}``), for a page that reads its table a page at a time (100,000 ranks)."""
        if not self._running:
            yield sse("closed", '{"reason":"server stopping"}')
            return
        sub = self.feed.subscribe()
        self._subs.add(sub)
        try:
            yield f"retry: {CLIENT_RETRY_MS}\n".encode() + sse("hello", dumps({"run": run}))
            async for chunk in self._frames(sub, run, tables):
                yield chunk
        finally:
            self._subs.discard(sub)
            sub.close()

    async def _frames(
        self, sub: Subscription, run: str | None, whole: bool
    ) -> AsyncIterator[bytes]:
        dropped_seen = 0
        tables: dict[Any, dict[str, Any]] = {}  # run -> the last ranks message sent in full
        while True:
            # The same waiting task survives heartbeats, so a timeout can never lose a message.
            waiting = asyncio.ensure_future(sub.get_many(MAX_BATCH))
            try:
                while not (await asyncio.wait({waiting}, timeout=self.heartbeat_s))[0]:
                    yield b": ping\n\n"
                batch = waiting.result()
            except FeedClosed:
                yield sse("closed", '{"reason":"feed closed"}')
                return
            finally:
                if not waiting.done():
                    waiting.cancel()
            if len(batch) < MAX_BATCH and COALESCE_S > 0:
                await asyncio.sleep(COALESCE_S)
                batch.extend(sub.drain(MAX_BATCH - len(batch)))
            if sub.dropped != dropped_seen:
                dropped_seen = sub.dropped
                tables.clear()  # a table may have been lost: the next one goes whole
                yield sse("resync", dumps({"dropped": dropped_seen}))
            wanted = [
                out if whole else _changes_only(out)
                for m in batch
                if _for_run(m, run) and (out := self._ranks_as_sent(m, tables)) is not None
            ]
            if wanted:
                self.frames_sent += 1
                yield sse("feed", "[" + ",".join(map(self._json, wanted)) + "]")

    def _ranks_as_sent(
        self, message: dict[str, Any], tables: dict[Any, dict[str, Any]]
    ) -> dict[str, Any] | None:
        """``message`` as this stream sends it: a rank table becomes its delta against the
        table the stream sent before (None: nothing changed); other messages pass."""
        if message.get("type") != "ranks" or not isinstance(message.get("ranks"), list):
            return message
        key = message.get("run")
        prev = tables.get(key)
        tables[key] = message
        if prev is None:
            return message
        pair = (id(prev), id(message))
        hit = self._deltas.get(pair)
        if hit is not None and hit[0] is prev and hit[1] is message:
            delta = hit[2]
        else:
            delta = _delta_message(prev, message)
            self._deltas[pair] = (prev, message, delta)
            while len(self._deltas) > SHARED_DELTAS:
                self._deltas.popitem(last=False)
        if delta is None:
            self.ranks_unchanged += 1
        return delta

    def _json(self, message: dict[str, Any]) -> str:
        """``dumps(message)``, shared by every stream (they all run on the event loop)."""
        hit = self._json_of.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        text = dumps_fast(message)
        self.encoded += 1
        self._json_of[id(message)] = (message, text)
        self._json_chars += len(text)
        while self._json_chars > SHARED_JSON_CHARS and len(self._json_of) > 1:
            self._json_chars -= len(self._json_of.popitem(last=False)[1][1])
        return text


def _for_run(message: dict[str, Any], run: str | None) -> bool:
    # Messages without a run (global counters, say) go to every page.
    return run is None or message.get("run", run) == run


def _changes_only(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("type") != "ranks" or not isinstance(message.get("ranks"), list):
        return message
    changed = len(message["ranks"]) + len(message.get("removed") or ())
    return {"type": "ranks", "run": message.get("run"), "changed": changed}


def _delta_message(prev: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    changed, removed = ranks_delta(prev["ranks"], new["ranks"])
    if not changed and not removed:
        return None
    out: dict[str, Any] = {"type": "ranks", "run": new.get("run"), "delta": True}
    out["ranks"] = changed
    if removed:
        out["removed"] = removed
    return out
