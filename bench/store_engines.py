"""Which embedded engine should hold the history? DuckDB vs SQLite vs a file of our own.

(a) insert throughput: 1M long rows (run, rank, seq, step, epoch, time, metric, value) in
    flush-sized batches, one commit per batch, as the aggregator writes them;
(b) the overlay query: one metric over R ranks x S steps, min/max per rank per bucket so that
    each rank gets <= 2,000 points, straight from the raw rows (no rollups).
The store's own rollups are timed on the same data as a fourth line. Prints medians and the
ratio against DuckDB measured in the same run.
(c) the Store's live flush: R ranks x 2 steps x 4 metrics appended as records, then one
    flush() (rollups and band included), as the service does every 200 ms: p50/p95.

    python bench/store_engines.py [--rows 1000000] [--ranks 1024] [--steps 10000]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.store.db import Store

RUN, METRIC = "bench-run", "loss"
POINTS = 2000


def rows(n: int, ranks: int, first_step: int = 0) -> dict[str, np.ndarray]:
    """n long rows, step-major (all ranks of a step, then the next step) like live ingest."""
    i = np.arange(n)
    step = first_step + i // ranks
    return {
        "run": np.full(n, RUN, dtype=object),
        "rank": (i % ranks).astype(np.int32),
        "seq": step + 1,
        "step": step,
        "epoch": np.zeros(n, np.int64),
        "time": 1.7e9 + step * 0.1,
        "metric": np.full(n, METRIC, dtype=object),
        "value": np.sin(step / 300.0) + (i % ranks) * 1e-3,
    }


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- DuckDB -------------------------------------------------------------------------------


class Duck:
    name = "duckdb (numpy bulk insert)"

    def __init__(self, path: Path) -> None:
        self.con = duckdb.connect(str(path))
        self.con.execute(
            "CREATE TABLE steps (run VARCHAR, rank INTEGER, seq BIGINT, step BIGINT, "
            "epoch BIGINT, time DOUBLE, metric VARCHAR, value DOUBLE)"
        )

    def insert(self, batch: dict[str, np.ndarray]) -> None:
        self.con.register("batch", batch)
        self.con.execute("INSERT INTO steps SELECT * FROM batch")  # autocommit: one commit
        self.con.unregister("batch")

    def overlay(self, steps: int) -> int:
        width = max(1, steps // (POINTS // 2))
        res = self.con.execute(
            f"SELECT rank, step // {width} AS b, min(value), arg_min(step, value), max(value), "
            "arg_max(step, value) FROM steps WHERE run = ? AND metric = ? "
            "GROUP BY rank, b ORDER BY rank, b",
            [RUN, METRIC],
        ).fetchnumpy()
        return len(res["b"])


# --- SQLite -------------------------------------------------------------------------------


class Lite:
    name = "sqlite (WAL, executemany)"

    def __init__(self, path: Path) -> None:
        self.con = sqlite3.connect(path)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=NORMAL")
        self.con.execute(
            "CREATE TABLE steps (run TEXT, rank INTEGER, seq INTEGER, step INTEGER, "
            "epoch INTEGER, time REAL, metric TEXT, value REAL)"
        )
        # without it every overlay query scans the whole table
        self.con.execute("CREATE INDEX steps_q ON steps (run, metric, rank, step)")

    def insert(self, batch: dict[str, np.ndarray]) -> None:
        cols = [batch[c].tolist() for c in batch]
        with self.con:
            self.con.executemany(
                "INSERT INTO steps VALUES (?,?,?,?,?,?,?,?)", zip(*cols, strict=True)
            )

    def overlay(self, steps: int) -> int:
        width = max(1, steps // (POINTS // 2))
        cur = self.con.execute(
            f"SELECT rank, step / {width} AS b, min(value), max(value) FROM steps "
            "WHERE run = ? AND metric = ? GROUP BY rank, b ORDER BY rank, b",
            [RUN, METRIC],
        )
        return len(cur.fetchall())


# --- an append-only column file of our own ------------------------------------------------


class Flat:
    name = "own append-only column files"
    cols = (("rank", np.int32), ("seq", np.int64), ("step", np.int64), ("epoch", np.int64),
            ("time", np.float64), ("value", np.float64), ("key", np.int32))  # fmt: skip

    def __init__(self, path: Path) -> None:
        path.mkdir()
        self.path = path
        self.names: dict[tuple[str, str], int] = {}  # (run, metric) -> key
        self.files = {c: open(path / c, "ab") for c, _ in self.cols}  # noqa: SIM115

    def insert(self, batch: dict[str, np.ndarray]) -> None:
        pairs = list(zip(batch["run"].tolist(), batch["metric"].tolist(), strict=True))
        key = np.array([self.names.setdefault(p, len(self.names)) for p in pairs], np.int32)
        for col, dtype in self.cols:
            arr = key if col == "key" else batch[col]
            self.files[col].write(np.ascontiguousarray(arr, dtype=dtype).tobytes())
        for f in self.files.values():
            f.flush()

    def overlay(self, steps: int) -> int:
        width = max(1, steps // (POINTS // 2))
        data = {c: np.memmap(self.path / c, dtype=t, mode="r") for c, t in self.cols}
        sel = data["key"] == self.names[(RUN, METRIC)]
        group = (
            data["rank"][sel].astype(np.int64) * (steps // width + 1) + data["step"][sel] // width
        )
        order = np.argsort(group, kind="stable")
        g, v = group[order], data["value"][sel][order]
        first = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
        np.minimum.reduceat(v, first), np.maximum.reduceat(v, first)
        return len(first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows for the insert test")
    ap.add_argument("--batch", type=int, default=10_000, help="rows per commit (one flush)")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--flushes", type=int, default=100, help="live flushes timed in (c)")
    args = ap.parse_args()
    engines = (Duck, Lite, Flat)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"(a) insert {args.rows:,} rows in batches of {args.batch:,}, one commit each")
        insert: dict[str, float] = {}
        for i, engine in enumerate(engines):
            db = engine(root / f"insert{i}")
            batches = [rows(args.batch, args.ranks, k * args.batch // args.ranks)
                       for k in range(args.rows // args.batch)]  # fmt: skip
            t0 = time.perf_counter()
            for b in batches:
                db.insert(b)
            insert[engine.name] = args.rows / (time.perf_counter() - t0)
        for name, rate in insert.items():
            ratio = rate / insert[Duck.name]
            print(f"  {name:34s} {rate / 1e6:7.2f} M rows/s   x{ratio:.2f} vs duckdb")

        total = args.ranks * args.steps
        print(
            f"(b) overlay query: 1 metric, {args.ranks} ranks x {args.steps:,} steps "
            f"({total:,} rows), <= {POINTS} points per rank, median of {args.repeat}"
        )
        query: dict[str, float] = {}
        chunk = 1_000_000 // args.ranks * args.ranks
        for i, engine in enumerate(engines):
            db = engine(root / f"query{i}")
            for k in range(0, total, chunk):
                db.insert(rows(min(chunk, total - k), args.ranks, k // args.ranks))
            db.overlay(args.steps)  # warm caches, as a dashboard refresh would
            query[engine.name] = median_s(lambda db=db: db.overlay(args.steps), args.repeat)
        store = Store(root / "store.duckdb")
        per_flush = max(1, chunk // args.ranks)
        for s0 in range(0, args.steps, per_flush):
            st = np.arange(s0, min(s0 + per_flush, args.steps))
            rank = np.tile(np.arange(args.ranks), len(st))
            steps = np.repeat(st, args.ranks)
            store.append_steps(RUN, METRIC, rank, steps, np.sin(steps / 300.0), world_size=1024)
            store.flush()
        store.series(RUN, METRIC)
        name = "rankwatch Store (duckdb + rollups)"
        query[name] = median_s(lambda: store.series(RUN, METRIC, max_points=POINTS), args.repeat)
        store.close()
        for name, secs in query.items():
            ratio = secs / query[Duck.name]
            print(f"  {name:34s} {secs * 1e3:9.1f} ms        x{ratio:.2f} vs duckdb")
        live_flushes(root, args.ranks, args.flushes)


def live_flushes(root: Path, ranks: int, flushes: int) -> None:
    print(f"(c) live: {ranks} ranks x 2 steps x 4 metrics per flush, {flushes} flushes")
    append_s, flush_s = [], []
    with Store(root / "live.duckdb") as store:
        for k in range(flushes):
            recs = [
                StepRecord(RUN, r, 2 * k + i + 1, 1.7e9 + k, ranks, "node", 1000 + r, 2 * k + i,
                           0, {"loss": 1.0 / (k + 1), "lr": 1e-3, "grad_norm": 2.0, "acc": 0.5})
                for i in range(2)
                for r in range(ranks)
            ]  # fmt: skip
            t0 = time.perf_counter()
            store.append(recs)
            t1 = time.perf_counter()
            store.flush()
            append_s.append(t1 - t0)
            flush_s.append(time.perf_counter() - t1)
    for name, xs in (("append()", append_s), ("flush()", flush_s)):
        xs = sorted(xs)
        p95 = xs[round(0.95 * (len(xs) - 1))]
        print(f"  {name:10s} p50 {statistics.median(xs) * 1e3:7.1f} ms   p95 {p95 * 1e3:7.1f} ms")
    rate = 2 * ranks * 4 / statistics.median(flush_s)
    print(f"  one flush writes {2 * ranks * 4:,} rows: {rate / 1e6:.2f}M rows/s at the median")


if __name__ == "__main__":
    main()
