"""The store's flush thread: writes what the ingest thread buffered, and keeps going when the
disk refuses (logged once, counted, retried every ``retry_s``; the records stay buffered).

When to flush: most of a flush's cost is per rank it touches, not per record (each rank's seq
interval, summary row and open rollup buckets are rewritten), so a buffer of many ranks with
few records each is left to grow, up to ``max_s`` (``flush_due``). With few ranks a flush is
cheap, and it runs every ``pause_s`` as before."""

from __future__ import annotations

import logging
import threading
import time

from rankwatch.aggregator.store.db import Store, StoreError

log = logging.getLogger("rankwatch.service")

WAIT_RANKS = 256  # from this many ranks in the buffer, a flush waits for ...
RECORDS_PER_RANK = 8  # ... this many records per rank on average, up to max_s


def flush_due(waited_s: float, max_s: float, pending: int, ranks: int, backlog: int) -> bool:
    """Whether a flush that has waited ``waited_s`` since the last one should run now, with
    ``pending`` records of ``ranks`` ranks buffered (``backlog`` records: at once)."""
    if waited_s >= max_s or ranks < WAIT_RANKS or pending >= backlog:
        return True
    return pending >= RECORDS_PER_RANK * ranks


class Flusher:
    def __init__(
        self,
        store: Store,
        pause_s: float,
        backlog_records: int,
        retry_s: float,
        max_s: float | None = None,
    ) -> None:
        self.store = store
        self.pause_s = pause_s
        self.max_s = pause_s if max_s is None else max(pause_s, max_s)
        self.backlog_records = backlog_records
        self.retry_s = retry_s
        self.error: str | None = None  # the last failure, until a flush succeeds again
        self.errors = 0
        self._retry_at = 0.0

    def run(self, stop: threading.Event) -> None:
        """Flush until ``stop`` is set. The wait starts when a flush ends: a flush has a fixed
        cost, and starting them on a fixed period makes more, smaller ones under load (more
        CPU per record at thousands of ranks, docs/benchmarks.md). Unless a backlog built up
        during the flush: a flush that big costs little per record, and waiting only grows it.
        A buffer of many ranks waits longer (``flush_due``)."""
        wait = self.pause_s
        since = time.monotonic()
        while not stop.wait(wait):
            store = self.store
            waited = time.monotonic() - since
            pending, ranks = store.pending(), store.buffered_ranks()
            if not flush_due(waited, self.max_s, pending, ranks, self.backlog_records):
                wait = min(self.pause_s, self.max_s - waited)
                continue
            flushed = self.flush()
            since = time.monotonic()
            backlog = flushed and self.store.pending() >= self.backlog_records
            wait = 0.0 if backlog else self.pause_s

    def flush(self) -> bool:
        """Write buffered records; on failure log once, count, and retry later."""
        now = time.monotonic()
        if self.error is not None and now < self._retry_at:
            return False
        try:
            self.store.flush()
        except StoreError as exc:
            self.errors += 1
            self._retry_at = now + self.retry_s
            if self.error is None:
                log.error(
                    "rankwatch: cannot write the store (%s); the live view goes on and records "
                    "stay in memory; retrying every %.0f s",
                    exc,
                    self.retry_s,
                )
            self.error = str(exc)
            return False
        if self.error is not None:
            log.warning("rankwatch: the store is writable again; buffered records are stored")
            self.error = None
        return True
