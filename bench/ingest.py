"""Aggregator ingest rate against the raw ZeroMQ + msgpack ceiling, measured in the same run.

    python bench/ingest.py [--records 200000] [--ranks 8] [--metrics 4] [--batch 100]

For single-record frames and for batched frames (``--batch`` records per frame, as the agent
sends them) it measures:

* baseline: a bare ROUTER socket (same options as the receiver) doing ``recv_multipart`` and
  ``msgpack.unpackb`` per message and nothing else (the issue's ceiling, and the goal's);
* the same loop with ``msgspec.msgpack.decode`` instead, a faster msgpack decoder (the
  aggregator's receiver decodes an agent's batch with msgspec: ``aggregator/frames.py``), so
  the ratios against the fastest bare loop are printed too;
* aggregator: a real ``Aggregator`` (receiver, decode, dedupe, health, store, merge, divergence,
  alerts), with the collector set up as ``rankwatch serve`` sets it (``tune_gc``), until every
  record is accepted, and until every record is flushed to the store.

The senders run in another process with frames encoded in advance. Each figure is the median
(and p95) of ``--repeats`` runs; the ratio aggregator / baseline is the goal (>= 0.25).

``--stages`` adds where the time goes: CPU time of this thread per record for each stage of the
ingest thread, run in this process on the same frames (no sockets, no flush thread), next to
``msgpack.unpackb`` alone. Thread CPU time, so a busy machine distorts it less than the rates.

Settings to compare (the defaults are what ``rankwatch serve`` runs): ``--duckdb-threads N``
(the store's DuckDB threads), ``--switch-interval S`` (``sys.setswitchinterval``), and
``--flush-log`` (each store flush of the last batched run: when it started, how many records,
its wall time and its thread's CPU time, to see whether the store keeps up).
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import zmq
from rankwatch.agent.wire import records
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.ingest import frames as aggregator_frames
from rankwatch.aggregator.ingest.receiver import RCVHWM_MESSAGES
from rankwatch.aggregator.merge import StepGrid, StepMerger, StepValues
from rankwatch.aggregator.seqs import SeqTracker
from rankwatch.aggregator.service import Aggregator, ServeConfig, tune_gc
from rankwatch.aggregator.store.db import Store

STAGE_CHUNK_RECORDS = 5000  # records handed to Aggregator.add() at once in --stages
METRICS = ("loss", "lr", "grad_norm", "step_time", "throughput", "loss_scale", "acc", "tokens")
POLL_S = 0.005  # how often the aggregator's counters are read while waiting
SWITCH_INTERVAL = sys.getswitchinterval()  # restored after a run with --switch-interval
STAGE_TRIES = 3  # --stages: best of this many runs of each stage


def make_frames(
    ranks: int, metrics: int, records_total: int, batch: int, run: str
) -> list[list[bytes]]:
    """Frames per rank: rank k's records for consecutive steps, ``batch`` per frame."""
    steps = max(1, records_total // ranks)
    names = METRICS[:metrics]
    now = time.time()
    out: list[list[bytes]] = []
    for rank in range(ranks):
        wire = [
            {
                "kind": "step",
                "run": run,
                "rank": rank,
                "seq": s,
                "time": now + s * 0.1,
                "world_size": ranks,
                "host": f"node{rank // 8}",
                "pid": 1000 + rank,
                "step": s,
                "epoch": None,
                "metrics": {m: 1.0 / s + 0.001 * rank + i for i, m in enumerate(names)},
            }
            for s in range(1, steps + 1)
        ]
        out.append([records.encode_frame(wire[i : i + batch]) for i in range(0, steps, batch)])
    return out


def sender(endpoint: str, args: dict[str, Any], ready: Event, go: Event) -> None:
    frames = make_frames(**args)
    ctx = zmq.Context()
    socks = []
    for _ in frames:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.connect(endpoint)
        socks.append(sock)
    time.sleep(0.3)  # connections up before the clock starts
    ready.set()
    go.wait()
    # Round-robin over ranks, as concurrent ranks would interleave.
    for i in range(max(len(f) for f in frames)):
        for sock, rank_frames in zip(socks, frames, strict=True):
            if i < len(rank_frames):
                sock.send(rank_frames[i])
    for sock in socks:
        sock.close(linger=10_000)
    ctx.term()


def start_sender(endpoint: str, args: dict[str, Any]) -> tuple[mp.Process, Event]:
    ready, go = mp.Event(), mp.Event()
    proc = mp.Process(target=sender, args=(endpoint, args, ready, go), daemon=True)
    proc.start()
    if not ready.wait(120):
        raise RuntimeError("sender did not start")
    return proc, go


def baseline(args: dict[str, Any], expected: int, unpack: Callable[[bytes], Any]) -> float:
    """Records per second a bare ROUTER + ``unpack`` loop takes in."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.MAXMSGSIZE, records.MAX_FRAME_BYTES)
    sock.setsockopt(zmq.RCVHWM, RCVHWM_MESSAGES)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    proc, go = start_sender(f"tcp://127.0.0.1:{port}", args)
    got = 0
    recv = sock.recv_multipart
    started = time.perf_counter()
    go.set()
    while got < expected:
        _, frame = recv()
        got += len(unpack(frame)["records"])
    elapsed = time.perf_counter() - started
    proc.join(30)
    sock.close(0)
    ctx.term()
    return got / elapsed


def _msgpack_unpack(frame: bytes) -> Any:
    return msgpack.unpackb(frame, raw=False)


def aggregator(
    args: dict[str, Any],
    expected: int,
    subscribers: int,
    settings: argparse.Namespace | None = None,
    flush_log: list[tuple[float, float, float, int]] | None = None,
    evicted: list[int] | None = None,
) -> tuple[float, float]:
    """Records per second the real aggregator accepts, and has flushed to its store.
    ``flush_log`` gets (start s after the sender's go, wall s, thread CPU s, records) per
    flush; ``evicted`` the steps the merger closed before every rank reported."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServeConfig(
            data_dir=Path(tmp), ingest_host="127.0.0.1", ingest_port=0, console_alerts=False,
            resend_gaps=False,
        )  # fmt: skip
        agg = Aggregator(cfg)
        if settings is not None and settings.duckdb_threads:
            agg.store._writer.execute(f"SET threads = {int(settings.duckdb_threads)}")
        go_at = [math.inf]
        if flush_log is not None:
            agg.store.flush = _logged(agg.store, flush_log, go_at)  # type: ignore[method-assign]
        agg.start()
        tune_gc()  # as `rankwatch serve` runs it
        if settings is not None and settings.switch_interval:
            sys.setswitchinterval(settings.switch_interval)
        stop = threading.Event()
        readers = [threading.Thread(target=_drain, args=(agg, stop)) for _ in range(subscribers)]
        for reader in readers:
            reader.start()
        try:
            proc, go = start_sender(f"tcp://127.0.0.1:{agg.ingest_port}", args)
            started = go_at[0] = time.perf_counter()
            go.set()
            while agg.counters()["records_accepted"] < expected:
                time.sleep(POLL_S)
            accepted = time.perf_counter() - started
            while sum(r["records"] for r in agg.store.runs()) < expected:
                time.sleep(POLL_S)
            stored = time.perf_counter() - started
            proc.join(30)
            if evicted is not None:
                evicted.append(agg.counters()["merge_evicted"])
        finally:
            stop.set()
            for reader in readers:
                reader.join()
            agg.stop()
            sys.setswitchinterval(SWITCH_INTERVAL)
    return expected / accepted, expected / stored


def _logged(
    store: Store, log: list[tuple[float, float, float, int]], go_at: list[float]
) -> Callable[[], None]:
    flush = store.flush

    def logged() -> None:
        n = store.pending()
        t0, cpu0 = time.perf_counter(), time.thread_time()
        flush()
        if n and t0 > go_at[0]:
            log.append((t0 - go_at[0], time.perf_counter() - t0, time.thread_time() - cpu0, n))

    return logged


def _drain(agg: Aggregator, stop: threading.Event) -> None:
    sub = agg.feed.subscribe()
    while not stop.is_set():
        sub.get_blocking(0.1)
        sub.drain()
    sub.close()


def stages(args: dict[str, Any]) -> None:
    """Print this thread's CPU time per record for each ingest stage (see the module doc)."""
    per_rank = make_frames(**args)
    frames = [f[i] for i in range(max(map(len, per_rank))) for f in per_rank if i < len(f)]
    # what the receiver hands over: a batched frame of one rank is one StepBlock
    items = [item for f in frames for item in records.decode_frame_blocks(f)]
    count = sum(len(i) if type(i) is records.StepBlock else 1 for i in items)
    chunks, chunk, size = [], [], 0
    for item in items:
        chunk.append(item)
        size += len(item) if type(item) is records.StepBlock else 1
        if size >= STAGE_CHUNK_RECORDS:
            chunks.append(chunk)
            chunk, size = [], 0
    chunks += [chunk] if chunk else []
    now = time.time()
    merger = StepMerger()
    groups = [[sv for item in c for sv in _merge(item, merger, now)] for c in chunks]
    # The inputs held here are not the service's: keep the collector from scanning them.
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[Store] = []

        def store(filled: bool = False) -> Store:
            stores.append(Store(Path(tmp) / f"s{len(stores)}.duckdb"))
            for c in chunks if filled else ():
                stores[-1].append(c)
            return stores[-1]

        def unpack() -> None:
            for f in frames:
                msgpack.unpackb(f, raw=False)

        def decode() -> None:
            for f in frames:
                records.decode_frame_blocks(f)

        def unpack_fast() -> None:
            for f in frames:
                msgspec.msgpack.decode(f)

        def decode_fast() -> None:
            for f in frames:
                aggregator_frames.decode_frame_blocks(f)

        def each(fn: Callable[..., object], todo: list[Any], *more: Any) -> Callable[[], None]:
            def run() -> None:
                for item in todo:
                    fn(item, *more)

            return run

        def dedupe(item: Any, seqs: SeqTracker) -> None:
            if type(item) is records.StepBlock:
                seqs.accept_many(item.run, item.rank, item.seq)
            else:
                seqs.accept(item.run, item.rank, item.seq)

        per_group = sum(map(len, groups)) / count
        rows = {
            "msgpack.unpackb (the baseline's work)": lambda: unpack,
            "records.decode_frame_blocks (incl. unpackb)": lambda: decode,
            "msgspec.msgpack.decode (untyped)": lambda: unpack_fast,
            "frames.decode_frame_blocks (the receiver's)": lambda: decode_fast,
            "SeqTracker.accept / accept_many": lambda: each(dedupe, items, SeqTracker()),
            "Store.append": lambda: each(store().append, chunks),
            "StepMerger.add / add_block": lambda: each(_merge, items, StepMerger(), now),
            f"DivergenceDetector.update_many x{per_group:.2f}": lambda: each(
                DivergenceDetector().update_many, groups
            ),
            # and a tick per receive batch, as the ingest thread (about one per 0.2 s)
            "Aggregator.add, tick (all of the above)": lambda: each(
                lambda c, a: (a.add(c, imported=False, now=now), a.tick(now)), chunks,
                Aggregator(ServeConfig(data_dir=Path(tmp), console_alerts=False), store=store()),
            ),
            "Store.flush (on the flush thread)": lambda: store(filled=True).flush,
        }  # fmt: skip
        try:
            for name, make in rows.items():
                us = _best_cpu(make) / count * 1e6
                print(f"  stage {name:44s} {us:7.2f} us/record CPU")
        finally:
            for st in stores:
                st.close()
            gc.unfreeze()


def _merge(item: Any, merger: StepMerger, now: float) -> list[StepValues | StepGrid]:
    if type(item) is records.StepBlock:
        return merger.add_block(item, now)
    return merger.add(item, now)


def _best_cpu(make: Callable[[], Callable[[], object]]) -> float:
    """Least thread CPU seconds of make()() over STAGE_TRIES, a fresh make() each time."""
    best = float("inf")
    for _ in range(STAGE_TRIES):
        run = make()
        started = time.thread_time()
        run()
        best = min(best, time.thread_time() - started)
    return best


def summary(rates: list[float]) -> str:
    ordered = sorted(rates)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(rates):>10,.0f}/s  p95 {p95:>10,.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000, help="records per measurement")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--metrics", type=int, default=4, choices=range(1, len(METRICS) + 1))
    parser.add_argument("--batch", type=int, default=100, help="records per batched frame")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=0, help="live feed readers")
    parser.add_argument("--stages", action="store_true", help="CPU per record by stage")
    parser.add_argument("--batched-only", action="store_true", help="skip single-record frames")
    parser.add_argument("--duckdb-threads", type=int, default=0, help="the store's DuckDB threads")
    parser.add_argument("--switch-interval", type=float, default=0.0, help="seconds")
    parser.add_argument("--flush-log", action="store_true", help="each flush of the last run")
    opts = parser.parse_args()
    expected = (opts.records // opts.ranks) * opts.ranks
    print(
        f"{expected:,} records per run: {opts.ranks} ranks x {expected // opts.ranks:,} steps, "
        f"{opts.metrics} metrics each, {opts.repeats} repeats, {opts.subscribers} feed readers"
    )
    sizes = [("single-record frames", 1), (f"{opts.batch}-record frames", opts.batch)]
    for label, batch in sizes[1:] if opts.batched_only else sizes:
        base, base_fast, acc, stored = [], [], [], []
        evicted: list[int] = []
        flushes: list[tuple[float, float, float, int]] = []
        for i in range(opts.repeats):
            args = {"ranks": opts.ranks, "metrics": opts.metrics, "records_total": opts.records,
                    "batch": batch, "run": f"bench-{batch}-{i}"}  # fmt: skip
            base.append(baseline(args, expected, _msgpack_unpack))
            base_fast.append(baseline(args, expected, msgspec.msgpack.decode))
            flushes.clear()
            log = flushes if opts.flush_log and batch > 1 else None
            a, s = aggregator(args, expected, opts.subscribers, opts, log, evicted)
            acc.append(a)
            stored.append(s)
        ratio = statistics.median(acc) / statistics.median(base)
        ratio_stored = statistics.median(stored) / statistics.median(base)
        print(f"\n{label}")
        print(f"  baseline  ROUTER recv + msgpack unpack   {summary(base)}")
        print(f"  (faster)  ROUTER recv + msgspec decode   {summary(base_fast)}")
        print(f"  aggregator accepted (full pipeline)      {summary(acc)}")
        print(f"  aggregator flushed to the store          {summary(stored)}")
        print(f"  ratio accepted/baseline {ratio:.3f}   stored/baseline {ratio_stored:.3f}"
              f"   (goal >= 0.25)")  # fmt: skip
        fast = statistics.median(base_fast)
        print(f"  against the msgspec loop: accepted {statistics.median(acc) / fast:.3f}   "
              f"stored {statistics.median(stored) / fast:.3f}")  # fmt: skip
        if any(evicted):
            # The sender queues every frame at once: ZeroMQ may deliver one rank's frames far
            # ahead of another's, which synchronous ranks never do; such a run is slower.
            print(f"  merge: steps closed before every rank reported, per run: {evicted} "
                  "(ranks > 1,000 steps apart in the queues)")  # fmt: skip
        for start, wall, cpu, n in flushes:
            print(f"  flush at {start:6.2f} s: {n:9,} records, wall {wall * 1e3:6.0f} ms "
                  f"({wall / n * 1e6:4.1f} us/record), its thread's CPU {cpu * 1e3:5.0f} ms "
                  f"({cpu / n * 1e6:4.1f} us/record)")  # fmt: skip
        if opts.stages:
            stages({**args, "run": f"stages-{batch}"})


if __name__ == "__main__":
    main()
