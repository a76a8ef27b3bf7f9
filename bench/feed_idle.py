"""Bytes an idle page's live stream receives per minute from a run that is over.

    python bench/feed_idle.py [--ranks 2000] [--seconds 60]

A real ``Aggregator`` over a real store (a temporary directory) holds one run of ``--ranks``
ranks that logged a step and went silent, so every rank is lost; one page streams that run
(``LiveHub.stream``, the body of ``GET /api/stream?run=``) while the service's ticks run for
twice ``--seconds`` of aggregator time (the tick period, clock passed in: the figure does not
take real minutes). Measured: the stream's bytes in the second half, once the page has its
table (the first half, with the one whole table, is printed too). Baseline, in the same run:
the same feed messages each sent whole, as the stream did before it sent rank tables as
deltas; ratio = now / before.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import FLUSH_INTERVAL_S, Aggregator, ServeConfig
from rankwatch.dashboard.jsonenc import dumps
from rankwatch.dashboard.live import LiveHub, sse

RUN = "ended"


async def idle_minute(agg: Aggregator, seconds: float) -> list[tuple[int, int]]:
    """Per half: (bytes the stream sent, bytes of the same messages sent whole)."""
    hub = LiveHub(AggregatorProvider(agg))
    hub.start()
    whole = agg.feed.subscribe(maxsize=100_000)
    gen = hub.stream(RUN)
    await gen.__anext__()  # hello: subscribed
    sent = before = 0

    async def pump() -> None:
        nonlocal sent
        async for chunk in gen:
            sent += len(chunk)

    task = asyncio.ensure_future(pump())
    start = time.time() + 60.0  # every rank silent for a minute: lost
    halves = []
    ticks = round(seconds / FLUSH_INTERVAL_S)
    for half in range(2):
        for tick in range(ticks):
            agg.tick(start + (half * ticks + tick) * FLUSH_INTERVAL_S)
            await asyncio.sleep(0)
            for message in whole.drain(100_000):
                if message.get("run", RUN) == RUN:
                    before += len(sse("feed", "[" + dumps(message) + "]"))
        await asyncio.sleep(0.2)  # the stream's last burst
        halves.append((sent, before))
        sent = before = 0
    hub.stop()
    await task
    whole.close()
    return halves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        agg = Aggregator(
            ServeConfig(
                data_dir=Path(tmp),
                ingest_host="127.0.0.1",
                ingest_port=0,
                console_alerts=False,
                resend_gaps=False,
            )
        )
        try:
            t = time.time()
            agg.add(
                [
                    StepRecord(RUN, r, 1, t, args.ranks, f"node{r // 8}", 1000 + r, 1, None,
                               {"loss": 1.0 + r * 1e-3, "lr": 0.01})
                    for r in range(args.ranks)
                ]
            )  # fmt: skip
            (first, second) = asyncio.run(idle_minute(agg, args.seconds))
        finally:
            agg.stop()
    minute = 60.0 / args.seconds
    print(f"{args.ranks} ranks, run over (lost), one page, 2 x {args.seconds:.0f} s of ticks")
    for label, (sent, before) in (("first (table sent)", first), ("then (idle)", second)):
        print(
            f"  {label:19} before {before * minute / 1e6:8.3f} MB/min   "
            f"now {sent * minute / 1e6:8.3f} MB/min   ratio {sent / before:.4f}"
        )


if __name__ == "__main__":
    main()
