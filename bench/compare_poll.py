"""What the page's reference overlay costs the server while a run streams: one
``GET /api/run/compare`` (every metric both runs have, both bands at 20,000 points), which a live
page reads at most every 5 s, against the baseline measured in the same run: the band reads the
page already makes for its own charts (``GET /api/run/series?view=band`` of each metric).

Two runs of R ranks x S steps x M metrics go into a fresh store by bulk appends; the app
(``create_app`` over a real ``Aggregator``, never started: no ingest port) is driven in-process
through httpx's ASGI transport, so the figures are the route's own work, not the network's.

    python bench/compare_poll.py [--ranks 64] [--steps 5000] [--metrics 4] [--queries 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.store.db import Store
from rankwatch.dashboard.app import create_app

RUNS = ("train-1201-2200-aaaa", "train-1201-2210-bbbb")  # the reference, then this run
METRICS = ("loss", "throughput", "step_time", "grad_norm", "lr", "data_time")
FLUSH_STEPS = 1000


def build(store: Store, ranks: int, steps: int, metrics: int) -> None:
    rng = np.random.default_rng(0)
    for i, run in enumerate(RUNS):
        for s0 in range(0, steps, FLUSH_STEPS):
            st = np.arange(s0, min(s0 + FLUSH_STEPS, steps))
            step, rank = np.repeat(st, ranks), np.tile(np.arange(ranks), len(st))
            for metric in METRICS[:metrics]:
                value = 2.0 * np.exp(-step / (steps / 5)) * (1 + 0.1 * i)
                value += rng.normal(0, 0.01, len(step))
                t = 1.7e9 + i * 1e5 + step * 0.5
                store.append_steps(run, metric, rank, step, value, time_s=t, world_size=ranks)
            store.flush()


async def timed(client: httpx.AsyncClient, url: str, params: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = await client.get(url, params=params)
        res.raise_for_status()
        out.append(time.perf_counter() - t0)
    return out


async def measure(app: object, metrics: int, queries: int) -> tuple[list[float], list[float]]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        run = RUNS[1]
        await timed(client, "/api/run/compare", {"run": run}, 1)  # warm-up
        compare = await timed(client, "/api/run/compare", {"run": run}, queries)
        bands = [0.0] * queries
        for metric in METRICS[:metrics]:
            params = {"run": run, "metric": metric, "view": "band", "format": "bin",
                      "minmax": "false", "max_points": "2000"}  # fmt: skip
            for i, t in enumerate(await timed(client, "/api/run/series", params, queries)):
                bands[i] += t
        return compare, bands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--metrics", type=int, default=4, choices=range(1, len(METRICS) + 1))
    ap.add_argument("--queries", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="compare-poll-") as tmp:
        store = Store(Path(tmp) / "store.duckdb")
        t0 = time.perf_counter()
        build(store, args.ranks, args.steps, args.metrics)
        rows = 2 * args.ranks * args.steps * args.metrics
        print(f"built {rows / 1e6:.1f}M rows in {time.perf_counter() - t0:.1f} s")
        agg = Aggregator(
            ServeConfig(data_dir=Path(tmp), console_alerts=False, resend_gaps=False), store=store
        )
        try:
            compare, bands = asyncio.run(
                measure(create_app(AggregatorProvider(agg)), args.metrics, args.queries)
            )
        finally:
            agg.stop()
    c, b = statistics.median(compare) * 1e3, statistics.median(bands) * 1e3
    print(f"{args.ranks} ranks x {args.steps:,} steps x {args.metrics} metrics, 2 runs")
    print(f"  compare (all metrics, both runs): median {c:.1f} ms, max {max(compare) * 1e3:.1f} ms")
    print(f"  baseline, the page's own band reads (one per metric): median {b:.1f} ms")
    print(
        f"  ratio compare / baseline: {c / b:.2f}; at one compare per 5 s: {c / 50:.2f}% of a core"
    )


if __name__ == "__main__":
    main()
