"""When the flush thread writes: a buffer of many ranks with few records each waits (up to
``max_s``), since most of a flush's cost is per rank it touches; a few ranks flush at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.store.db import Store
from rankwatch.aggregator.store.flusher import RECORDS_PER_RANK, WAIT_RANKS, Flusher, flush_due

MANY = WAIT_RANKS + 44


def records(ranks: int, steps: int = 1) -> list[StepRecord]:
    return [
        StepRecord("r", rank, s + 1, 1e9 + s, ranks, "h", 1, s, None, {"loss": 1.0})
        for s in range(steps)
        for rank in range(ranks)
    ]


@pytest.mark.parametrize(
    ("waited_s", "pending", "ranks", "due"),
    [
        (0.5, 40, 8, True),  # few ranks: every pause, as before
        (0.5, 2 * MANY, MANY, False),  # many ranks, 2 records each: wait
        (1.9, (RECORDS_PER_RANK - 1) * MANY, MANY, False),
        (0.5, RECORDS_PER_RANK * MANY, MANY, True),  # enough records per rank
        (2.0, MANY, MANY, True),  # waited the longest it may
        (0.5, 100_000, 50_000, True),  # a backlog: at once
    ],
)
def test_flush_due(waited_s: float, pending: int, ranks: int, due: bool) -> None:
    assert flush_due(waited_s, 2.0, pending, ranks, backlog=100_000) is due


def test_buffered_ranks_counts_since_the_last_flush(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.append(records(5, steps=3))
        store.append(records(7))
        assert store.buffered_ranks() == 7
        store.flush()
        assert store.buffered_ranks() == 0
        store.append(records(2))
        assert store.buffered_ranks() == 2


def test_a_buffer_of_many_ranks_waits_for_more_records(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        flusher = Flusher(store, pause_s=0.05, backlog_records=10**6, retry_s=1.0, max_s=0.6)
        stop = threading.Event()
        thread = threading.Thread(target=flusher.run, args=(stop,))
        started = time.monotonic()
        store.append(records(MANY))
        thread.start()
        try:
            time.sleep(0.3)
            assert store.pending() == MANY  # 1 record per rank: not yet
            while store.pending() and time.monotonic() - started < 10.0:
                time.sleep(0.02)
            assert store.pending() == 0 and time.monotonic() - started >= 0.6
            store.append(records(8))  # a few ranks: the next pause
            few = time.monotonic()
            while store.pending() and time.monotonic() - few < 10.0:
                time.sleep(0.02)
            assert store.pending() == 0
        finally:
            stop.set()
            thread.join()
