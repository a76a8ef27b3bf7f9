"""The dashboard's overlay query at scale: all ranks of one metric, plus the cross-rank band.

Fills a store with R ranks x S steps of one metric (default 1,024 x 100,000 = 102.4M rows) by
bulk appends in step order, as live ingest would, and caches it under --data so it is built
once. Then, p50/p95 of --queries each at max_points=2000:

* the store: ``Store.series_columns()`` (numpy, what the dashboard uses) for all ranks and
  ``Store.band_columns()``, over the full range and zoomed windows, next to ``Store.series()``
  (the same points as Python lists, the previous read path);
* HTTP end to end: ``GET /api/runs/<run>/series`` through the real app (``create_app`` over a
  real ``Aggregator``) served by uvicorn on 127.0.0.1 in a thread of this process, timed until
  the client holds the whole body (not parsed); ``format=bin`` against the JSON (built from
  lists, as before the binary format) measured in the same run;
* the baseline: the same overlay from the raw rows (min/max per rank per bucket in SQL).

``--load`` times all of it again while a thread appends another run (1,024 ranks x 5 steps/s by
default) and flushes every 0.5 s, as the aggregator does; the queries then run on a copy of the
cached store, which stays as built. Also reports RSS and the store's size per million records.

    python bench/overlay_query.py --data /var/tmp/rankwatch-bench [--steps 10000] [--load]
"""

from __future__ import annotations

import argparse
import atexit
import random
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import httpx
import numpy as np
import uvicorn
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.store.db import Store
from rankwatch.dashboard.app import create_app

RUN, METRIC, LOAD_RUN = "overlay", "loss", "load"
LOAD_FLUSH_S = 0.5  # the aggregator's STORE_FLUSH_S


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


def timed(
    fn: Callable[[], object], n: int, spans: list[tuple[float, float]] | None = None
) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        out.append(t1 - t0)
        if spans is not None:
            spans.append((t0, t1))
    return out


def report_overlap(queries: list[tuple[float, float]], flushes: list[tuple[float, float]]) -> None:
    """Queries that ran while a flush did, against those that did not: a query waiting behind
    a flush would take about as long as the flush."""
    busy = [any(a < f1 and f0 < b for f0, f1 in flushes) for a, b in queries]
    took = [(b - a) * 1e3 for a, b in queries]
    hit = [t for t, o in zip(took, busy, strict=True) if o]
    clear = [t for t, o in zip(took, busy, strict=True) if not o]
    if hit and clear:
        mid_hit, mid_clear = statistics.median(hit), statistics.median(clear)
        print(f"    {len(hit)} of {len(took)} overlapped a flush: median {mid_hit:.1f} ms, "
              f"the others {mid_clear:.1f} ms")  # fmt: skip


def p50_p95(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1e3, p95 * 1e3


@contextmanager
def load(store: Store, ranks: int, steps_per_s: float) -> Iterator[list[tuple[float, float]]]:
    """A thread appending LOAD_RUN at ``steps_per_s`` steps of every rank and flushing every
    LOAD_FLUSH_S; yields the flushes' (start, end) perf_counter times as they happen."""
    flushes: list[tuple[float, float]] = []
    stop = threading.Event()
    rng = np.random.default_rng(1)

    def run() -> None:
        step, due = 0, time.perf_counter()
        per_flush = max(1, round(steps_per_s * LOAD_FLUSH_S))
        while not stop.is_set():
            st = np.repeat(np.arange(step, step + per_flush), ranks)
            rank = np.tile(np.arange(ranks), per_flush)
            store.append_steps(LOAD_RUN, METRIC, rank, st, rng.normal(1, 0.1, len(st)),
                               time_s=np.full(len(st), time.time()), world_size=ranks)  # fmt: skip
            t0 = time.perf_counter()
            store.flush()
            flushes.append((t0, time.perf_counter()))
            step += per_flush
            due += LOAD_FLUSH_S
            stop.wait(max(0.0, due - time.perf_counter()))

    thread = threading.Thread(target=run, name="load", daemon=True)
    thread.start()
    try:
        time.sleep(2 * LOAD_FLUSH_S)  # past the first flushes of a new run
        yield flushes
    finally:
        stop.set()
        thread.join()


@contextmanager
def http_server(store: Store, tmp: Path) -> Iterator[str]:
    """The dashboard app over a real Aggregator (never started: no ingest port) on uvicorn."""
    agg = Aggregator(
        ServeConfig(data_dir=tmp, console_alerts=False, resend_gaps=False), store=store
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(AggregatorProvider(agg)), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="cache directory for the store")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--http-queries", type=int, default=10, help="per JSON case: ~1 s each")
    ap.add_argument("--max-points", type=int, default=2000)
    ap.add_argument("--flush-steps", type=int, default=1000, help="steps per bulk flush")
    ap.add_argument("--load", action="store_true", help="time again under appends + flushes")
    ap.add_argument("--load-steps-per-s", type=float, default=5.0, help="per rank, --load")
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
    tmp = Path(tempfile.mkdtemp(prefix="overlay-", dir=args.data))
    atexit.register(shutil.rmtree, tmp, True)  # the copy below is as big as the store
    query_path = path
    if args.load:  # the load writes: keep the cached store as built
        query_path = tmp / path.name
        shutil.copyfile(path, query_path)
    # reopen, as the aggregator does after a restart
    t0 = time.perf_counter()
    store = Store(query_path)
    open_s = time.perf_counter() - t0
    n, mp, steps = args.queries, args.max_points, args.steps
    rnd = random.Random(1)

    def window(width: int) -> tuple[int, int]:
        a = rnd.randrange(0, max(1, steps - width))
        return a, a + width - 1

    ten, one_k = steps // 10, min(1000, steps)
    cases: dict[str, Callable[[], object]] = {
        "series, full range": lambda: store.series_columns(RUN, METRIC, max_points=mp),
        "  the same as lists (Store.series)": lambda: store.series(RUN, METRIC, max_points=mp),
        "band, full range": lambda: store.band_columns(RUN, METRIC, max_points=mp),
        "series, 10% window": lambda: store.series_columns(
            RUN, METRIC, None, *window(ten), max_points=mp
        ),
        "  the same as lists (Store.series), 10%": lambda: store.series(
            RUN, METRIC, None, *window(ten), max_points=mp
        ),
        "band, 10% window": lambda: store.band_columns(RUN, METRIC, *window(ten), max_points=mp),
        "series, 1,000 steps (raw)": lambda: store.series_columns(
            RUN, METRIC, None, *window(one_k), max_points=mp
        ),
        "band, 1,000 steps": lambda: store.band_columns(RUN, METRIC, *window(one_k), max_points=mp),
        "series, one rank, full range": lambda: store.series_columns(
            RUN, METRIC, [rnd.randrange(args.ranks)], max_points=mp
        ),
    }
    full = store.series_columns(RUN, METRIC, max_points=mp)
    i = int(np.searchsorted(full.keys, 7))
    assert 50.0 in full.value[full.offsets[i] : full.offsets[i + 1]], "the spike was lost"
    assert full.to_lists() == store.series(RUN, METRIC, max_points=mp)
    per_m = size / records * 1e6 / 2**20
    print(f"store: {records / 1e6:.1f}M records, {size / 2**20:.0f} MiB on disk "
          f"({per_m:.1f} MiB per million records), reopen {open_s:.2f} s")  # fmt: skip
    print(f"full-range overlay: {len(full)} ranks, {full.points:,} points "
          f"(max {int(full.counts.max())} per rank)")  # fmt: skip

    # HTTP cases: the JSON (every field, the response before the binary format), the binary
    # as the page asks for it (no per-point min/max) and the binary with every field.
    http_formats = {
        "json": {"format": "json"},
        "bin, as the page asks": {"format": "bin", "minmax": "false"},
        "bin, every field": {"format": "bin"},
    }

    def http_params(kind: str) -> dict[str, object]:
        params: dict[str, object] = {"metric": METRIC, "max_points": mp, "view": "ranks"}
        if kind == "10% window":
            params["start"], params["end"] = window(ten)
        elif kind == "band view":
            params["view"] = "band"
        return params

    def run_all(label: str, flushes: list[tuple[float, float]] | None = None) -> dict:
        print(f"\n{label}\n{'query':40s} {'p50 ms':>9s} {'p95 ms':>9s}")
        results = {}
        for name, fn in cases.items():
            fn()  # warm
            spans: list[tuple[float, float]] = []
            results[name] = p50_p95(timed(fn, n, spans))
            print(f"{name:40s} {results[name][0]:9.1f} {results[name][1]:9.1f}")
            if flushes is not None and name.startswith("series, "):
                report_overlap(spans, flushes)
        print(f"{'HTTP GET .../series, view=ranks':40s} {'p50 ms':>9s} {'p95 ms':>9s} {'MB':>7s}")
        url = f"/api/runs/{RUN}/series"
        with http_server(store, tmp) as base, httpx.Client(base_url=base, timeout=120) as client:
            for kind in ("full range", "10% window", "band view"):
                print(f"  {kind}")
                for fmt, extra in http_formats.items():
                    size = [0]

                    def get(kind: str = kind, extra: dict = extra, size: list = size) -> None:
                        res = client.get(url, params={**http_params(kind), **extra})
                        res.raise_for_status()
                        size[0] = len(res.content)

                    get()  # warm
                    reps = args.http_queries if fmt == "json" else max(n, args.http_queries)
                    p50, p95 = results[(kind, fmt)] = p50_p95(timed(get, reps))
                    print(f"    {fmt:36s} {p50:9.1f} {p95:9.1f} {size[0] / 1e6:7.1f}")
                page = "bin, as the page asks"
                (j50, j95), (b50, b95) = results[(kind, "json")], results[(kind, page)]
                print(f"    {'ratio json / ' + page:36s} {j50 / b50:8.1f}x {j95 / b95:8.1f}x")
        return results

    quiet = run_all("quiet")
    if args.load:
        rate = args.ranks * args.load_steps_per_s
        with load(store, args.ranks, args.load_steps_per_s) as flushes:
            label = f"under load: {rate:,.0f} rows/s appended, a flush every {LOAD_FLUSH_S} s"
            busy = run_all(label, flushes)
        f50, f95 = p50_p95([b - a for a, b in flushes])
        print(f"load: {len(flushes)} flushes, p50 {f50:.0f} ms, p95 {f95:.0f} ms each")
        print(f"\n{'p95 under load / quiet':40s}")
        keys = ["series, full range", "series, 10% window", "band, full range"]
        keys += [(kind, "bin, as the page asks") for kind in ("full range", "10% window")]
        for key in keys:
            name = key if isinstance(key, str) else f"HTTP {key[0]}, {key[1]}"
            print(f"{name:40s} {busy[key][1] / quiet[key][1]:8.2f}x")
    cur, peak = rss_mb()
    print(f"\nRSS after queries: {cur:.0f} MiB (peak {peak:.0f} MiB, including the build if any)")
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
    ratio = base[0] / quiet["series, full range"][0]
    print(f"{'baseline: raw-row min/max in SQL':40s} {base[0]:9.1f} {base[1]:9.1f}"
          f"   (rollups x{ratio:.1f} faster at p50, quiet)")  # fmt: skip
    if args.data.name.startswith("tmp-"):
        shutil.rmtree(args.data)


if __name__ == "__main__":
    main()
