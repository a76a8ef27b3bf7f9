"""CPU of the live stream (``/api/stream``) per step by number of open pages, 4,096 ranks.

    python bench/stream_fanout.py [--ranks 4096] [--steps 40] [--pages 1,4,16]

Each step publishes what the aggregator publishes for one step of every rank: one ``points``
message per metric (5 metrics, a point per rank, built by ``feed.points_messages`` from step
records), on a real ``Feed``; ``--pages`` streams of a ``LiveHub`` (the body of each
``GET /api/stream``) take their frame of it on one asyncio loop, as uvicorn runs them. Measured:
the loop thread's CPU per step (the 30 ms a stream waits for the rest of a burst is not CPU).
Baseline, measured in the same run: every stream encoding its own JSON (the hub's shared JSON
switched off), as before the hub shared it; ratio = shared / own.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.feed import Feed, points_messages
from rankwatch.aggregator.service import MAX_FEED_POINTS
from rankwatch.dashboard import live
from rankwatch.dashboard.live import LiveHub

METRICS = ("loss", "lr", "throughput", "step_time", "grad_norm")
REPEATS = 3


def step_messages(ranks: int, steps: int) -> list[list[dict[str, Any]]]:
    """Per step, the points messages of every rank's record of that step."""
    rng = np.random.default_rng(0)
    out = []
    for step in range(steps):
        values = rng.random((ranks, len(METRICS))).tolist()
        records = [
            StepRecord("run", rank, step + 1, 0.0, ranks, "node", 1, step, None,
                       dict(zip(METRICS, row, strict=True)))
            for rank, row in enumerate(values)
        ]  # fmt: skip
        out.append(points_messages(records, MAX_FEED_POINTS)[0])
    return out


async def stream_cpu(steps: list[list[dict[str, Any]]], pages: int) -> tuple[float, int]:
    """The loop thread's CPU seconds per step for ``pages`` streams; bytes per page-step."""
    feed = Feed(queue_max=10_000)
    hub = LiveHub(feed)
    hub.start()
    gens = [hub.stream() for _ in range(pages)]
    try:
        for gen in gens:
            await gen.__anext__()  # hello: subscribed
        size, t0 = 0, time.thread_time()
        for messages in steps:
            for message in messages:
                feed.publish(message)
            frames = await asyncio.gather(*(gen.__anext__() for gen in gens))
            size += sum(map(len, frames))
        cpu = time.thread_time() - t0
    finally:
        for gen in gens:
            await gen.aclose()
        hub.stop()
    return cpu / len(steps), size // (len(steps) * pages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4_096)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pages", default="1,4,16")
    args = ap.parse_args()
    print(f"{args.ranks:,} ranks x {len(METRICS)} metrics per step, {args.steps} steps, "
          f"median of {REPEATS}; loop CPU per step")  # fmt: skip
    print(f"{'pages':>5} {'own JSON ms':>12} {'shared ms':>10} {'ratio':>6} {'frame KB':>9}")
    shared_chars = live.SHARED_JSON_CHARS
    steps = step_messages(args.ranks, args.steps)  # each hub is new: nothing is shared across runs
    for pages in (int(p) for p in args.pages.split(",")):
        own, shared, size = [], [], 0
        for _ in range(REPEATS):
            for cap, out in ((0, own), (shared_chars, shared)):
                live.SHARED_JSON_CHARS = cap  # 0: nothing kept, every stream encodes its own
                cpu, size = asyncio.run(stream_cpu(steps, pages))
                out.append(cpu)
        live.SHARED_JSON_CHARS = shared_chars
        a, b = statistics.median(own), statistics.median(shared)
        print(f"{pages:5d} {a * 1e3:12.2f} {b * 1e3:10.2f} {b / a:6.2f} {size / 1e3:9.0f}")


if __name__ == "__main__":
    main()
