"""Feed: publish from a plain thread, consume on an asyncio loop, bounded with drop-oldest."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest
from rankwatch.agent.wire.records import EventRecord, StepRecord
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.feed import (
    FEED_DIVERGENCES,
    FEED_EVENTS,
    Feed,
    FeedClosed,
    divergence_messages,
    event_messages,
    points_messages,
)


def test_messages_cross_from_a_thread_to_an_asyncio_consumer_in_order() -> None:
    feed = Feed()

    async def consume() -> list[int]:
        sub = feed.subscribe()
        producer = threading.Thread(
            target=lambda: [feed.publish({"i": i}) for i in range(500)], daemon=True
        )
        producer.start()
        got = [(await asyncio.wait_for(sub.get(), 5))["i"] for _ in range(500)]
        producer.join()
        sub.close()
        return got

    assert asyncio.run(consume()) == list(range(500))
    assert feed.dropped == 0
    assert feed.published == 500


def test_a_waiting_consumer_is_woken_by_a_later_publish() -> None:
    feed = Feed()

    async def main() -> dict[str, int]:
        sub = feed.subscribe()
        timer = threading.Timer(0.05, feed.publish, args=({"late": 1},))
        timer.start()
        message = await asyncio.wait_for(sub.get(), 5)
        timer.join()
        return message

    assert asyncio.run(main()) == {"late": 1}


def test_slow_subscriber_drops_oldest_and_counts_without_blocking_publish() -> None:
    feed = Feed(queue_max=10)
    slow = feed.subscribe()
    fast = feed.subscribe(maxsize=1000)
    for i in range(25):
        feed.publish({"i": i})
    assert [m["i"] for m in slow.drain()] == list(range(15, 25))  # newest kept
    assert slow.dropped == 15
    assert len(fast.drain()) == 25 and fast.dropped == 0
    assert feed.dropped == 15
    slow.close()
    assert feed.dropped == 15  # still counted after the subscriber left
    assert feed.subscribers == 1


def test_close_wakes_waiting_consumers_and_later_publishes_are_ignored() -> None:
    feed = Feed()

    async def main() -> str:
        sub = feed.subscribe()
        threading.Timer(0.05, feed.close).start()
        try:
            await asyncio.wait_for(sub.get(), 5)
        except FeedClosed:
            return "closed"
        return "message"

    assert asyncio.run(main()) == "closed"
    feed.publish({"after": True})
    late = feed.subscribe()
    assert late.closed
    with pytest.raises(FeedClosed):
        late.get_nowait()


def test_cancelled_get_loses_no_message() -> None:
    feed = Feed()

    async def main() -> dict[str, int]:
        sub = feed.subscribe()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sub.get(), 0.02)
        feed.publish({"n": 7})
        return await asyncio.wait_for(sub.get(), 5)

    assert asyncio.run(main()) == {"n": 7}


def test_async_iteration_and_blocking_get() -> None:
    feed = Feed()
    sub = feed.subscribe()
    assert sub.get_blocking(0.01) is None
    feed.publish({"a": 1})
    assert sub.get_blocking(1) == {"a": 1}
    for i in range(3):
        feed.publish({"i": i})

    async def main() -> list[int]:
        got = []
        async for message in sub:
            got.append(message["i"])
            if len(got) == 3:
                sub.close()
        return got

    assert asyncio.run(main()) == [0, 1, 2]
    assert not feed.has_subscribers


def test_get_many_batches_what_is_queued() -> None:
    feed = Feed()

    async def main() -> list[dict[str, int]]:
        sub = feed.subscribe()
        for i in range(5):
            feed.publish({"i": i})
        return await sub.get_many(3)

    assert [m["i"] for m in asyncio.run(main())] == [0, 1, 2]


def _rec(rank: int, step: int, **metrics: float) -> StepRecord:
    return StepRecord(
        run="r", rank=rank, seq=step, time=0.0, world_size=2, host="h", pid=1, step=step,
        epoch=None, metrics=metrics,
    )  # fmt: skip


def test_points_messages_group_by_metric_and_write_nonfinite_as_jsonl_does() -> None:
    steps = [_rec(0, 1, loss=1.0, lr=0.1), _rec(1, 1, loss=math.nan, lr=0.1),
             _rec(0, 2, loss=math.inf)]  # fmt: skip
    messages, sampled = points_messages(steps, max_points=100)
    assert not sampled
    assert messages == [
        {"type": "points", "run": "r", "metric": "loss",
         "points": [[0, 1, 1.0], [1, 1, "NaN"], [0, 2, "Infinity"]]},
        {"type": "points", "run": "r", "metric": "lr", "points": [[0, 1, 0.1], [1, 1, 0.1]]},
    ]  # fmt: skip
    json.dumps(messages, allow_nan=False)  # strict JSON


def test_points_messages_sample_a_flood() -> None:
    steps = [_rec(s % 2, s, loss=float(s)) for s in range(1, 1001)]
    (message,), sampled = points_messages(steps, max_points=100)
    assert sampled and message["sampled"] is True
    assert 50 <= len(message["points"]) <= 100


def test_a_steps_divergences_past_the_first_few_are_one_counting_message() -> None:
    def div(rank: int) -> Divergence:
        return Divergence("r", "loss", rank, "nonfinite", "high", 5, 5, math.nan, 1.0, math.nan,
                          math.nan, f"rank {rank} loss is NaN at step 5", 40)  # fmt: skip

    many = divergence_messages("r", "loss", 5, "new", [div(r) for r in range(FEED_DIVERGENCES + 4)])
    assert [m["rank"] for m in many[:-1]] == list(range(FEED_DIVERGENCES))
    assert all(m["type"] == "divergence" and m["value"] == "NaN" for m in many[:-1])
    assert many[-1] == {"type": "divergences", "state": "new", "run": "r", "metric": "loss",
                        "step": 5, "count": 4}  # fmt: skip
    json.dumps(many, allow_nan=False)  # strict JSON, as the stream sends it
    few = divergence_messages("r", "loss", 5, "resolved", [div(r) for r in range(FEED_DIVERGENCES)])
    assert len(few) == FEED_DIVERGENCES and {m["state"] for m in few} == {"resolved"}
    assert divergence_messages("r", "loss", 5, "new", []) == []


def test_a_ticks_events_past_a_runs_first_few_are_one_counting_message_per_run() -> None:
    def ev(run: str, rank: int, event: str) -> EventRecord:
        return EventRecord(run, rank, 1, 10.0 + rank, 64, f"node{rank // 8}", 100 + rank, event,
                           None if event == "start" else 9, {"value": math.nan})  # fmt: skip

    big = [ev("a", r, "start") for r in range(FEED_EVENTS + 30)]
    big += [ev("a", r, "crash") for r in range(10)]
    small = [ev("b", r, "end") for r in range(3)]
    out = event_messages(big[:5] + small + big[5:])  # the runs' events interleaved
    shown = [m for m in out if m["type"] == "event"]
    assert [(m["run"], m["rank"]) for m in shown] == (
        [("a", r) for r in range(5)] + [("b", r) for r in range(3)]
        + [("a", r) for r in range(5, FEED_EVENTS)]
    )  # fmt: skip
    assert shown[0] == {"type": "event", "run": "a", "rank": 0, "event": "start", "step": None,
                        "time": 10.0, "info": {"value": "NaN"}}  # fmt: skip
    assert out[-1] == {"type": "events", "run": "a", "count": 40,
                       "by_event": {"start": 30, "crash": 10}}  # fmt: skip
    assert len(out) == FEED_EVENTS + 3 + 1  # run b's three all shown, nothing counted for it
    json.dumps(out, allow_nan=False)
    assert event_messages([]) == []
