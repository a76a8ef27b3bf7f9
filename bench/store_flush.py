"""Per-record cost of the history store's flush (aggregator/store.py), by flush size.

8 ranks x 4 metrics, the frames bench/ingest.py sends, appended N records at a time (as the
StepBlocks ``decode_frame_blocks`` makes, and as StepRecords) then ``flush()``. Printed per flush
size: median per-record wall, thread CPU and process CPU (DuckDB's threads too) of a flush,
quiet; then its wall time with a busy Python thread beside it (the ingest thread's stand-in),
and how much that thread lost per record (time it could not run: the flush holding the GIL, or
DuckDB's threads holding the cores). Baseline, measured in the same run: msgpack-unpacking the
same records; ratio = flush / unpack.

    python bench/store_flush.py [--sizes 5000,25000,100000] [--flushes 5] [--switch-interval S]

``--lock`` measures instead why a flush slows beside a busy thread: DuckDB's Python client
takes the interpreter lock back after every task it runs (to check for Ctrl-C), so a query
beside a busy Python thread waits up to a switch interval per task. One aggregate over a
400,000-row table, alone and beside the busy thread, by DuckDB thread count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import make_frames
from rankwatch.agent.wire import records
from rankwatch.aggregator.store.db import Store

RANKS = 8
METRICS = 4
FRAME_RECORDS = 100  # records per agent frame (one StepBlock each)
SPIN_CHUNK = 1000  # loop iterations per spinner count
_RECORD_TYPES = (records.StepRecord, records.EventRecord, records.Heartbeat)


class Spinner:
    """A pure-Python busy thread; counts work done, so lost time = missed work / solo rate."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop:
            for _ in range(SPIN_CHUNK):
                pass
            self.count += 1

    def __enter__(self) -> Spinner:
        self._thread.start()
        time.sleep(0.2)
        c0, t0 = self.count, time.perf_counter()
        time.sleep(0.5)
        self.rate = (self.count - c0) / (time.perf_counter() - t0)  # counts per second alone
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()


def run_size(items: list[Any], n: int, flushes: int, spin: bool) -> dict[str, float]:
    """Median per-record wall/CPU (µs) of ``flushes`` flushes of ``n`` records each."""
    chunks = _chunks(items, n, flushes + 1)
    walls, cpus, procs, lost = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "s.duckdb") as store:
        spinner = Spinner().__enter__() if spin else None
        try:
            for i, chunk in enumerate(chunks):
                store.append(chunk)
                c0 = spinner.count if spinner else 0
                t0, cpu0, proc0 = time.perf_counter(), time.thread_time(), time.process_time()
                store.flush()
                wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
                proc = time.process_time() - proc0  # DuckDB's threads too (and the spinner's)
                if i == 0:
                    continue  # the first flush creates the rows of every rank and series
                walls.append(wall / n * 1e6)
                cpus.append(cpu / n * 1e6)
                procs.append(proc / n * 1e6)
                if spinner:
                    lost.append((wall - (spinner.count - c0) / spinner.rate) / n * 1e6)
        finally:
            if spinner:
                spinner.__exit__()
    out = {k: statistics.median(v) for k, v in (("wall", walls), ("cpu", cpus), ("proc", procs))}
    if spin:
        out["lost"] = statistics.median(lost)
    return out


def _chunks(items: list[Any], n: int, count: int) -> list[list[Any]]:
    """``count`` chunks of ``n`` records each (blocks count as their records)."""
    out, cur, size, pos = [], [], 0, 0
    while len(out) < count:
        if pos >= len(items):
            raise SystemExit("not enough records for the sizes asked for")
        item = items[pos]
        pos += 1
        cur.append(item)
        size += 1 if isinstance(item, _RECORD_TYPES) else len(item)
        if size >= n:
            out.append(cur)
            cur, size = [], 0
    return out


def unpack_us(frames: list[bytes], total: int) -> float:
    """Median msgpack-unpack time per record (µs) over the frames."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for f in frames:
            msgpack.unpackb(f, raw=False)
        times.append((time.perf_counter() - t0) / total * 1e6)
    return statistics.median(times)


def lock_cost(switch_interval: float | None) -> None:
    """Median ms of one aggregate over a 400,000-row temp table, alone / beside a busy thread."""
    import duckdb
    import numpy as np

    n = 400_000
    con = duckdb.connect()
    columns = {  # noqa: F841  (read by name by DuckDB's replacement scan)
        "a": np.arange(n, dtype=np.int64),
        "b": np.random.default_rng(0).random(n),
        "c": (np.arange(n) % 8).astype(np.int32),
    }
    con.execute("CREATE TEMP TABLE t AS SELECT * FROM columns")
    sql = (  # into a table: no result rows for Python to build
        "CREATE OR REPLACE TEMP TABLE r AS "
        "SELECT c, a // 16 AS g, count(*), sum(b), arg_min(a, b) FROM t GROUP BY c, a // 16"
    )

    def median_ms(runs: int = 7) -> float:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            con.execute(sql)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    si = sys.getswitchinterval() if switch_interval is None else switch_interval
    print(f"switch interval {si * 1e3:g} ms; aggregate over {n:,} rows, median ms")
    for threads in (2, 1):
        con.execute(f"SET threads = {threads}")
        alone = median_ms()
        with Spinner():
            busy = median_ms()
        print(f"  DuckDB threads {threads}: alone {alone:6.1f}   beside a busy thread {busy:6.1f}"
              f"   (x{busy / alone:.1f})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="5000,25000,100000")
    ap.add_argument("--flushes", type=int, default=5, help="timed flushes per size")
    ap.add_argument("--records-only", action="store_true", help="skip the StepBlock input")
    ap.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval (s) to try"
    )
    ap.add_argument("--lock", action="store_true", help="DuckDB's calls beside a busy thread")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.lock:
        lock_cost(args.switch_interval)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    total = max(sizes) * (args.flushes + 1)
    per_rank = make_frames(RANKS, METRICS, total + RANKS * FRAME_RECORDS, FRAME_RECORDS, "r")
    frames = [f[i] for i in range(max(map(len, per_rank))) for f in per_rank if i < len(f)]
    recs = [r for f in frames for r in records.decode_frame(f)]
    decode_blocks = getattr(records, "decode_frame_blocks", None)
    blocks = [b for f in frames for b in decode_blocks(f)] if decode_blocks else None
    base = unpack_us(frames, len(recs))
    print(f"{len(recs)} records ({RANKS} ranks x {METRICS} metrics, {FRAME_RECORDS} per frame)")
    print(f"baseline: msgpack unpack {base:.2f} µs/record")
    inputs = [("records", recs)]
    if blocks is not None and not args.records_only:
        inputs.insert(0, ("blocks", blocks))
    print(
        "input    flush N   wall µs/rec  cpu µs/rec  (x unpack)  process cpu  | "
        "busy thread beside: wall µs/rec  thread lost µs/rec"
    )
    for name, items in inputs:
        for n in sizes:
            quiet = run_size(items, n, args.flushes, spin=False)
            busy = run_size(items, n, args.flushes, spin=True)
            print(
                f"{name:8s} {n:7d}   {quiet['wall']:8.2f}    {quiet['cpu']:8.2f}   "
                f"({quiet['wall'] / base:5.1f}x)   {quiet['proc']:8.2f}     |   "
                f"{busy['wall']:8.2f}       "
                f"{busy['lost']:8.2f}"
            )


if __name__ == "__main__":
    main()
