"""A NaN cascade through a real aggregator and store: one card's NaN, then every card's a step
later. The stream says it in a few messages (the first divergences and a count of the rest),
so an open page's queue does not overflow: it loses nothing and need not read every view again
(a resync) at the worst time."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from rankwatch.agent.wire.records import EventRecord
from rankwatch.aggregator.feed import FEED_DIVERGENCES, FEED_EVENTS, SUBSCRIBER_QUEUE_MAX
from rankwatch.aggregator.service import Aggregator, ServeConfig

from tests.nancascade import cascade_step

RANKS, FIRST, METRICS = 600, 7, ("loss", "grad_norm")


def test_a_cascade_streams_the_first_divergences_and_counts_the_rest(tmp_path: Path) -> None:
    agg = Aggregator(ServeConfig(data_dir=tmp_path, console_alerts=False, resend_gaps=False))
    sub = agg.feed.subscribe()
    # a message per divergence would overflow the page's queue: the test needs a real cascade
    assert RANKS * len(METRICS) > SUBSCRIBER_QUEUE_MAX
    steps: list[list[dict]] = []
    try:
        for step in range(1, 8):
            now = time.time()
            recs = cascade_step("c", step, RANKS, FIRST, 6, METRICS, now)
            agg.add(recs, imported=False, now=now)
            agg.tick(now)
            steps.append(sub.drain())
    finally:
        agg.store.close()
    assert sub.dropped == 0
    first, cascade = steps[5], steps[6]
    assert {(m["rank"], m["metric"]) for m in first if m["type"] == "divergence"} == {
        (FIRST, m) for m in METRICS}  # fmt: skip
    assert any(m["type"] == "incident" for m in first)
    kinds = Counter(m["type"] for m in cascade)
    assert kinds["divergence"] == FEED_DIVERGENCES * len(METRICS)
    counted = [m for m in cascade if m["type"] == "divergences"]
    assert sorted(m["metric"] for m in counted) == sorted(METRICS)
    # every rank but the first flagged at step 7: the first few as messages, the rest counted
    assert all(m["count"] == RANKS - 1 - FEED_DIVERGENCES and m["step"] == 7 for m in counted)
    assert all(m["state"] == "new" and m["run"] == "c" for m in counted)
    points = {m["metric"] for m in cascade if m["type"] == "points"}
    assert points == set(METRICS)  # the step's points reached the page
    assert agg.detector.listing("c").total == RANKS * len(METRICS)


def test_a_jobs_start_streams_its_first_events_and_counts_the_rest(tmp_path: Path) -> None:
    """Every rank's start event comes within a tick: as one message each they overflowed an
    open page's queue (it lost the tick's points too, and read every view again)."""
    ranks = SUBSCRIBER_QUEUE_MAX + 500
    agg = Aggregator(ServeConfig(data_dir=tmp_path, console_alerts=False, resend_gaps=False))
    sub = agg.feed.subscribe()
    try:
        now = time.time()
        starts = [EventRecord("job", r, 0, now, ranks, f"node{r // 8}", 100 + r, "start", None,
                              {}) for r in range(ranks)]  # fmt: skip
        agg.add([*starts, *cascade_step("job", 1, ranks, 0, 99, ("loss",), now)], imported=False,
                now=now)  # fmt: skip
        agg.tick(now)
        got = sub.drain()
        agg.store.flush()
        stored = agg.store.events("job")
    finally:
        agg.store.close()
    assert sub.dropped == 0
    kinds = Counter(m["type"] for m in got)
    assert kinds["event"] == FEED_EVENTS
    (counted,) = [m for m in got if m["type"] == "events"]
    assert counted == {"type": "events", "run": "job", "count": ranks - FEED_EVENTS,
                       "by_event": {"start": ranks - FEED_EVENTS}}  # fmt: skip
    (points,) = [m for m in got if m["type"] == "points"]
    assert len(points["points"]) == ranks  # the tick's points reached the page
    assert len(stored) == ranks  # every event is stored all the same
