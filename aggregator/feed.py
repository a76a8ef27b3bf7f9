"""In-process live feed: the service thread publishes, dashboard streams consume.

``publish()`` is called from the aggregator's service thread and never blocks: each
subscriber has a bounded queue, and when a slow browser lags the oldest messages are dropped
(and counted) instead of slowing ingest. Subscribers are asyncio consumers on the uvicorn
loop (``await sub.get()``); a plain thread can use ``sub.get_blocking(timeout)``.

The second half of the module builds the messages (and the snapshot's rank entries): small,
JSON-ready dicts with NaN and ±Inf written as "NaN", "Infinity", "-Infinity", as in JSONL.

    {"type": "points", "run", "metric", "points": [[rank, step, value], ...], "sampled"?}
                                                             (built in ``feedpoints.py``)
    {"type": "ranks", "run", "ranks": [rank entry, ...]}    (see ``rank_entry``)
    {"type": "divergence", "state": "new" | "resolved", **Divergence fields}
    {"type": "divergences", "state", "run", "metric", "step", "count"}
                                            (the step's divergences beyond FEED_DIVERGENCES)
    {"type": "alert", **Alert fields}
    {"type": "event", "run", "rank", "event", "step", "time", "info"}
    {"type": "events", "run", "count", "by_event": {event: count}}
                                          (a tick's events of a run beyond FEED_EVENTS)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rankwatch.agent.wire.jsonsafe import json_safe, json_value
from rankwatch.agent.wire.records import EventRecord
from rankwatch.aggregator.feedpoints import points_messages as points_messages
from rankwatch.aggregator.health.rules import OVER_STATES
from rankwatch.aggregator.incidents.oneline import one_line

if TYPE_CHECKING:
    from rankwatch.aggregator.divergence.types import Divergence
    from rankwatch.aggregator.health import RankHealth

MESSAGE_LINES_CACHED = 8192  # crash messages' one-line forms kept (a rank's stays the same)
SUBSCRIBER_QUEUE_MAX = 1000  # messages buffered per subscriber before the oldest is dropped
FEED_DIVERGENCES = 16  # divergence messages per scored step and state; the rest as a count
FEED_EVENTS = 16  # event messages per run and tick; the rest as a count


class FeedClosed(Exception):
    """The subscription (or the whole feed) was closed; no more messages will come."""


class Subscription:
    """One consumer's bounded queue. Create with ``Feed.subscribe()``."""

    def __init__(self, feed: Feed, maxsize: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self._feed = feed
        self._maxsize = maxsize
        self._items: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.dropped = 0  # messages this subscriber lost because it lagged

    # --- producer side (any thread) -------------------------------------------------------

    def _put(self, message: dict[str, Any]) -> int:
        """Queue one message; returns how many old messages were dropped for it (0 or 1)."""
        dropped = 0
        with self._cond:
            if self._closed:
                return 0
            if len(self._items) >= self._maxsize:
                self._items.popleft()
                self.dropped += 1
                dropped = 1
            self._items.append(message)
            self._cond.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._wake(waiter)
        return dropped

    def _wake(self, waiter: asyncio.Future[None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        # Waking the loop costs a syscall, so it is done only when a consumer is waiting.
        with contextlib.suppress(RuntimeError):  # loop closed between the check and the call
            loop.call_soon_threadsafe(_resolve, waiter)

    # --- consumer side --------------------------------------------------------------------

    def get_nowait(self) -> dict[str, Any] | None:
        """The next message, or None when the queue is empty (raises FeedClosed when closed)."""
        with self._cond:
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise FeedClosed
            return None

    def drain(self, limit: int = SUBSCRIBER_QUEUE_MAX) -> list[dict[str, Any]]:
        """Up to ``limit`` queued messages without waiting (possibly none)."""
        with self._cond:
            n = min(limit, len(self._items))
            return [self._items.popleft() for _ in range(n)]

    async def get(self) -> dict[str, Any]:
        """Wait for the next message on the running asyncio loop; FeedClosed when closed."""
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                if self._closed:
                    raise FeedClosed
                if self._loop is None:
                    self._loop = asyncio.get_running_loop()
                waiter = self._loop.create_future()
                self._waiter = waiter
            try:
                await waiter
            finally:
                with self._cond:
                    if self._waiter is waiter:
                        self._waiter = None

    async def get_many(self, limit: int = 100) -> list[dict[str, Any]]:
        """Wait for at least one message, then take up to ``limit`` (for batched sends)."""
        first = await self.get()
        return [first, *self.drain(limit - 1)]

    def get_blocking(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Thread consumers: wait up to ``timeout`` s; None on timeout, FeedClosed when closed."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout)
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise FeedClosed
            return None

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            try:
                yield await self.get()
            except FeedClosed:
                return

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        return len(self._items)

    def close(self) -> None:
        """Unsubscribe; a waiting ``get()`` raises FeedClosed. Idempotent."""
        self._feed._remove(self)
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._wake(waiter)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Feed:
    """Thread-safe fan-out of small JSON-ready dicts to any number of subscribers."""

    def __init__(self, queue_max: int = SUBSCRIBER_QUEUE_MAX) -> None:
        self._queue_max = queue_max
        self._subs: tuple[Subscription, ...] = ()
        self._lock = threading.Lock()
        self._closed = False
        self.published = 0
        self._dropped_gone = 0  # drops counted by subscriptions that have since closed

    def subscribe(self, maxsize: int | None = None) -> Subscription:
        """A new subscription. Call from the asyncio loop that will ``await get()``, or from
        any thread (the loop is then captured on the first ``get()``)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        sub = Subscription(self, maxsize or self._queue_max, loop)
        with self._lock:
            if self._closed:
                sub._shutdown()
                return sub
            self._subs = (*self._subs, sub)
        return sub

    def publish(self, message: dict[str, Any]) -> None:
        """Hand ``message`` to every subscriber; never blocks. Subscribers must not mutate it."""
        subs = self._subs  # a tuple swapped under the lock: safe to iterate without it
        self.published += 1
        for sub in subs:
            sub._put(message)

    @property
    def has_subscribers(self) -> bool:
        """False lets the service skip building messages nobody would read."""
        return bool(self._subs)

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    @property
    def dropped(self) -> int:
        """Messages dropped for lagging subscribers, in total."""
        return self._dropped_gone + sum(s.dropped for s in self._subs)

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs = tuple(s for s in self._subs if s is not sub)
                self._dropped_gone += sub.dropped

    def close(self) -> None:
        """Close every subscription and ignore later publishes. Idempotent."""
        with self._lock:
            self._closed = True
            subs, self._subs = self._subs, ()
            self._dropped_gone += sum(s.dropped for s in subs)
        for sub in subs:
            sub._shutdown()

    @property
    def closed(self) -> bool:
        return self._closed


# --- message shapes ------------------------------------------------------------------------


def num(value: float | None) -> float | str | None:
    """A float as strict JSON allows it: NaN and ±Inf as strings, like JSONL."""
    return None if value is None else json_value(value)


jsonable = json_safe  # dataclasses, enums and non-finite floats made JSON-ready (recursively)


def divergence_messages(
    run: str, metric: str, step: int, state: str, items: Sequence[Divergence]
) -> list[dict[str, Any]]:
    """The messages for the divergences one scored step flagged (``state`` "new") or resolved:
    one each for the first ``FEED_DIVERGENCES``, and one ``divergences`` message counting the
    rest. A cascade flags every rank at once: a message each overflowed an open page's queue
    (``SUBSCRIBER_QUEUE_MAX``), dropping whatever came before them, and sent the page to read
    every view again (``resync``) at the worst time, while the page reads these messages only
    as a sign to read its rank table and alerts again."""
    out = [{"type": "divergence", "state": state, **jsonable(d)} for d in items[:FEED_DIVERGENCES]]
    if len(items) > FEED_DIVERGENCES:
        out.append({"type": "divergences", "state": state, "run": run, "metric": metric,
                    "step": step, "count": len(items) - FEED_DIVERGENCES})  # fmt: skip
    return out


def event_messages(events: Sequence[EventRecord]) -> list[dict[str, Any]]:
    """The messages for one tick's events: one each for a run's first ``FEED_EVENTS``, and one
    ``events`` message per run counting the rest by event. Every rank of a job starts (and
    ends, or crashes in a cascade) within a tick or two: as for divergences, a message each
    overflowed an open page's queue, while the page reads them only as a sign to read its
    events again."""
    out: list[dict[str, Any]] = []
    shown: dict[str, int] = {}
    rest: dict[str, dict[str, int]] = {}
    for ev in events:
        n = shown.get(ev.run, 0)
        if n < FEED_EVENTS:
            shown[ev.run] = n + 1
            out.append(event_message(ev))
        else:
            counts = rest.setdefault(ev.run, {})
            counts[ev.event] = counts.get(ev.event, 0) + 1
    out += [{"type": "events", "run": run, "count": sum(counts.values()), "by_event": counts}
            for run, counts in rest.items()]  # fmt: skip
    return out


def event_message(ev: EventRecord) -> dict[str, Any]:
    return {
        "type": "event",
        "run": ev.run,
        "rank": ev.rank,
        "event": ev.event,
        "step": ev.step,
        "time": ev.time,
        "info": jsonable(ev.info),
    }


def rank_entry(
    h: RankHealth,
    values: Mapping[str, float],
    z: Mapping[str, float],
    divergent: list[str],
    gaps: Sequence[tuple[int, int]],
) -> dict[str, Any]:
    """One rank as the snapshot, ``ranks`` messages and ``rankwatch status`` show it."""
    return {
        "rank": h.rank,
        "state": h.state.value,
        "host": h.host,
        "pid": h.pid,
        "world_size": h.world_size,
        "last_step": h.last_step,
        "last_seen": h.last_seen,
        "first_seen": h.first_seen,
        "since": h.since,
        "message": h.message,
        "message_line": message_line(h.message, h.state.value == "crashed"),
        "step_time": num(h.step_time),
        "divergent": divergent,
        "z": {m: num(v) for m, v in z.items()},
        "values": {m: num(v) for m, v in values.items()},
        "throughput": num(values.get("throughput")),
        "dropped": h.dropped,
        "gaps": [list(g) for g in gaps],
    }


def message_line(message: str, crashed: bool = False) -> str:
    """A rank's message in one line for tables and banners: a crash's exception type and first
    meaningful line (``RuntimeError: Launch kernel failed, name:.../AllReduce-op2``); other
    messages are one line already ("no record for 40 s"). The entry keeps the whole text."""
    return _crash_line(message) if crashed or "\n" in message else message


# Cutting a long crash message costs far more than a lookup, and rank tables are built again
# every few seconds with the same messages.
_crash_line = functools.lru_cache(maxsize=MESSAGE_LINES_CACHED)(one_line)


def ranks_delta(
    prev: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], list[int]]:
    """What changed from one ``ranks`` table of a run to the next: the entries that differ
    (whole), and the ranks no longer there. Nothing changed: two empty lists.

    A rank that is over and stays so is unchanged whatever its ``message`` says: a lost rank's
    "no record for 40 s" restates the clock (the entry has ``last_seen``), and re-sending it
    would push a dead run's whole table to every page every refresh."""
    before = {entry.get("rank"): entry for entry in prev}
    changed: list[Mapping[str, Any]] = []
    for entry in new:
        old = before.pop(entry.get("rank"), None)
        if old is None or (old != entry and not _same_over(old, entry)):
            changed.append(entry)
    return changed, sorted(rank for rank in before if isinstance(rank, int))


def _same_over(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    if old.get("state") != new.get("state") or new.get("state") not in OVER_STATES:
        return False
    same = all(old.get(k) == v for k, v in new.items() if k not in _RESTATED)
    return same and len(old) == len(new)


_RESTATED = frozenset({"message", "message_line"})  # an over rank's words restate the clock
