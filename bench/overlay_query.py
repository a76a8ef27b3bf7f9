"""The dashboard's overlay query at scale: all ranks of one metric, plus the cross-rank band.

Fills a store with R ranks x S steps of one metric (default 1,024 x 100,000 = 102.4M rows) by
bulk appends in step order, as live ingest would, and caches it under --data so it is built
once. Then times Store.series() for all ranks and Store.band() at max_points=2000 over the
full range and over zoomed windows (p50/p95 of --queries each), against the same overlay
computed straight from the raw rows (min/max per rank per bucket in SQL, no rollups) as the
baseline. Reports RSS and the store's size per million records.

    python bench/overlay_query.py --data /var/tmp/rankwatch-bench [--steps 10000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
from rankwatch.aggregator.store import Store

RUN, METRIC = "overlay", "loss"


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def build(path: Path, ranks: int, steps: int, flush_steps: int) -> None:
    rng = np.random.default_rng(0)
    offset = rng.normal(0, 0.02, ranks)
    t0 = time.perf_counter()
    with Store(path) as store:
        for s0 in range(0, steps, flush_steps):
            st = np.arange(s0, min(s0 + flush_steps, steps))
            step = np.repeat(st, ranks)
            rank = np.tile(np.arange(ranks), len(st))
            value = 2.0 * np.exp(-step / (steps / 5)) + offset[rank]
            value += rng.normal(0, 0.01, len(step))
            value[(rank == 7) & (step == steps // 3)] = 50.0  # one spike that must survive
            store.append_steps(RUN, METRIC, rank, step, value, time_s=1.7e9 + step * 0.5,
                               world_size=ranks)  # fmt: skip
            store.flush()
            done = (s0 + len(st)) * ranks
            rate = done / (time.perf_counter() - t0)
            print(
                f"\r  built {done / 1e6:6.1f}M rows, {rate / 1e6:.2f}M rows/s", end="", flush=True
            )
    print()


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def p50_p95(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1e3, p95 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="cache directory for the store")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--max-points", type=int, default=2000)
    ap.add_argument("--flush-steps", type=int, default=1000, help="steps per bulk flush")
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    path = args.data / f"overlay-{args.ranks}x{args.steps}.duckdb"
    marker = path.with_suffix(".built")
    if args.rebuild or not marker.exists():
        for p in (path, Path(f"{path}.wal"), marker):
            p.unlink(missing_ok=True)
        args.data.mkdir(parents=True, exist_ok=True)
        print(f"building {args.ranks} ranks x {args.steps:,} steps into {path}")
        build(path, args.ranks, args.steps, args.flush_steps)
        marker.write_text("ok\n")
    records = args.ranks * args.steps
    size = sum(p.stat().st_size for p in (path, Path(f"{path}.wal")) if p.exists())
    # query a copy-free reopen, as the aggregator does after a restart
    t0 = time.perf_counter()
    store = Store(path)
    open_s = time.perf_counter() - t0
    n, mp, steps = args.queries, args.max_points, args.steps
    rnd = random.Random(1)

    def window(width: int) -> tuple[int, int]:
        a = rnd.randrange(0, max(1, steps - width))
        return a, a + width - 1

    cases: dict[str, Callable[[], object]] = {
        "series, full range": lambda: store.series(RUN, METRIC, max_points=mp),
        "band, full range": lambda: store.band(RUN, METRIC, max_points=mp),
        "series, 10% window": lambda: store.series(
            RUN, METRIC, None, *window(steps // 10), max_points=mp
        ),
        "band, 10% window": lambda: store.band(RUN, METRIC, *window(steps // 10), max_points=mp),
        "series, 1,000 steps (raw)": lambda: store.series(
            RUN, METRIC, None, *window(1000), max_points=mp
        ),
        "band, 1,000 steps": lambda: store.band(RUN, METRIC, *window(1000), max_points=mp),
        "series, one rank, full range": lambda: store.series(
            RUN, METRIC, [rnd.randrange(args.ranks)], max_points=mp
        ),
    }
    full = store.series(RUN, METRIC, max_points=mp)
    points = sum(len(p["step"]) for p in full.values())
    assert 50.0 in full[7]["value"], "the spike was lost"
    per_m = size / records * 1e6 / 2**20
    print(f"store: {records / 1e6:.1f}M records, {size / 2**20:.0f} MiB on disk "
          f"({per_m:.1f} MiB per million records), reopen {open_s:.2f} s")  # fmt: skip
    print(f"full-range overlay: {len(full)} ranks, {points:,} points "
          f"(max {max(len(p['step']) for p in full.values())} per rank)")  # fmt: skip
    print(f"{'query':34s} {'p50 ms':>9s} {'p95 ms':>9s}")
    results = {}
    for name, fn in cases.items():
        fn()  # warm
        results[name] = p50_p95(timed(fn, n))
        print(f"{name:34s} {results[name][0]:9.1f} {results[name][1]:9.1f}")
    cur, peak = rss_mb()
    print(f"RSS after queries: {cur:.0f} MiB (peak {peak:.0f} MiB, including the build if any)")
    store.close()

    # Baseline: the same full-range overlay from the raw rows, no rollups.
    con = duckdb.connect(str(path), read_only=True, config={"memory_limit": "512MB"})
    width = max(1, steps // (mp // 2))
    sql = (
        f"SELECT rank, step // {width} AS b, min(value), arg_min(step, value), max(value), "
        "arg_max(step, value) FROM steps WHERE run = ? AND metric = ? GROUP BY rank, b "
        "ORDER BY rank, b"
    )
    base = p50_p95(timed(lambda: con.execute(sql, [RUN, METRIC]).fetchnumpy(), max(3, n // 5)))
    con.close()
    ratio = base[0] / results["series, full range"][0]
    print(f"{'baseline: raw-row min/max in SQL':34s} {base[0]:9.1f} {base[1]:9.1f}"
          f"   (rollups x{ratio:.1f} faster at p50)")  # fmt: skip
    if args.data.name.startswith("tmp-"):
        shutil.rmtree(args.data)


if __name__ == "__main__":
    main()
