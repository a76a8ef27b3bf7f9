"""A million bad (and some good) messages at a real `rankwatch serve` while real ranks publish.

    python bench/fuzz_ingest.py [--frames 1000000] [--ranks 4] [--seed 1] [--json OUT]

Messages come from ``tests/hardening/frames.py``: valid frames, their mutations (bit flips,
truncation, splices), records with a field missing or mistyped, huge names, deep nesting,
unicode, NaN/Inf everywhere, negative and repeated steps, newer schema versions, non-map
envelopes, raw bytes, multipart messages; one frame over ``MAX_FRAME_BYTES`` every 100,000
goes on a connection of its own (libzmq drops that connection). What the aggregator must count
for each message is decided with the wire schema itself (``frames.Expected``).

Printed: messages per second (median and p95 over chunks of 50,000), the rejections counted by
reason against the expected counts, the valid records stored against those sent (fuzz runs and
the real ranks' JSONL), and ``/api/status`` latency before (baseline) and during the fuzzing,
with their ratio: the live view must hold under the load.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from rankwatch.agent.wire import records

from tests.hardening.frames import Expected, Sequencer, pack, random_message
from tests.hardening.procs import Rank, Serve, compare, read_jsonl, read_store, wait_until

VALID_RUN = "bench-valid"
CHUNK = 50_000  # messages per throughput sample
OVERSIZED_EVERY = 100_000
LINGER_MS = 60_000  # the fuzzing socket's close waits this long for its queue to go out
LATENCY_EVERY_S = 0.5
SETTLE_TIMEOUT_S = 1800.0  # the store may trail ingest by minutes on a busy machine
SNDHWM_MESSAGES = 10_000  # the fuzzer blocks beyond this: the send rate is the ingest rate
PROGRESS_S = 30.0


class Prober:
    """Times GET /api/status in a thread; the serve must answer throughout."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.samples: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.wait(LATENCY_EVERY_S):
                t = time.perf_counter()
                try:
                    client.get(f"{self.serve.url}/api/status").raise_for_status()
                    self.samples.append(time.perf_counter() - t)
                except httpx.HTTPError:
                    self.failures += 1


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fuzz(serve: Serve, total: int, seed: int) -> tuple[Expected, list[float], int]:
    """Send ``total`` messages; returns what must be counted, chunk rates, oversized sent."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    # Closing must not drop what is still queued (LINGER 0 did: a short run once lost its last
    # 16 messages, and the wait for every message to be counted never ended).
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    # A DEALER blocks at its high-water mark (it never drops): every message gets counted, and
    # the rate measured is what the aggregator takes in, not what this process can queue.
    sock.setsockopt(zmq.SNDHWM, SNDHWM_MESSAGES)
    sock.connect(f"tcp://{serve.addr}")
    rng, seqs, expected = random.Random(seed), Sequencer(), Expected()
    rates: list[float] = []
    oversized = 0
    big = pack({"v": 1, "records": ["x" * records.MAX_FRAME_BYTES]})
    try:
        chunk_start = time.perf_counter()
        for i in range(1, total + 1):
            message = random_message(rng, seqs, bounded=True)
            expected.add(message)
            sock.send_multipart(message)
            if i % OVERSIZED_EVERY == 0 or i == total // 2:
                oversized += _one_connection(ctx, serve, [big])
                if i == total // 2:  # a newer agent, told apart in the log
                    newer = [pack({"v": records.SCHEMA_VERSION + 1, "records": []})]
                    expected.add(newer)
                    _one_connection(ctx, serve, newer)
            if i % CHUNK == 0:
                now = time.perf_counter()
                rates.append(CHUNK / (now - chunk_start))
                chunk_start = now
                serve.check_alive()
                print(f"  {i:>9,} sent, {rates[-1]:,.0f}/s", flush=True)
        last = [pack({"v": 1, "records": []}), b"end"]
        expected.add(last)
        sock.send_multipart(last)
    finally:
        sock.close()
        ctx.term()
    return expected, rates, oversized


def _one_connection(ctx: zmq.Context[Any], serve: Serve, message: list[bytes]) -> int:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(f"tcp://{serve.addr}")
    sock.send_multipart(message)
    sock.close()
    return 1


def progress(what: str, count: Any, total: int) -> Any:
    """A wait_until predicate: ``count() == total``, saying how far along it is now and then."""
    said = [time.monotonic()]

    def check() -> bool:
        now_count = count()
        if time.monotonic() - said[0] > PROGRESS_S:
            said[0] = time.monotonic()
            print(f"  {what} {now_count:,} of {total:,}", flush=True)
        return bool(now_count == total)

    return check


def counted_errors(serve: Serve) -> Counter[str]:
    family = serve.metrics().get("rankwatch_aggregator_ingest_errors", {})
    return Counter({dict(labels)["kind"]: int(v) for labels, v in family.items()})


def stored_by_run(serve: Serve, runs: Counter[str]) -> Counter[str]:
    listing = serve.get("/api/runs", timeout=60)["runs"]
    return Counter({r["run"]: r.get("records") or 0 for r in listing if r["run"] in runs})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1_000_000, help="fuzz messages to send")
    parser.add_argument("--ranks", type=int, default=4, help="real ranks publishing meanwhile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = parser.parse_args()
    # Killed from outside (a timeout's SIGTERM): still stop the ranks and the server below.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="rankwatch-fuzz-") as tmp:
        root = Path(tmp)
        serve = Serve(root / "data", root / "serve.log").start()
        stop, logs = root / "stop", root / "logs"
        ranks = [
            Rank(VALID_RUN, k, args.ranks, serve.addr, logs, interval=0.02, stop_file=stop)
            for k in range(args.ranks)
        ]
        try:
            result = run(serve, ranks, stop, logs, args)
        finally:
            stop.touch()
            for rank in ranks:
                rank.stop()
            serve.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


def run(serve: Serve, ranks: list[Rank], stop: Path, logs: Path, args: Any) -> dict[str, Any]:
    wait_until("the valid ranks", lambda: len(serve.rank_states(VALID_RUN)) == args.ranks, 90)
    with Prober(serve) as idle:
        time.sleep(5.0)  # baseline: the live view with only the real ranks publishing
    print(f"fuzzing {args.frames:,} messages at {serve.addr} ...", flush=True)
    started = time.perf_counter()
    with Prober(serve) as busy:
        expected, rates, oversized = fuzz(serve, args.frames, args.seed)
        sent_s = time.perf_counter() - started
        wait_until(
            "every rejection to be counted",
            progress("counted", lambda: sum(counted_errors(serve).values()),
                     sum(expected.reasons.values())),
            SETTLE_TIMEOUT_S, 1.0,
            lambda: f"counted {counted_errors(serve)}\nexpected {expected.reasons}",
        )  # fmt: skip
        processed_s = time.perf_counter() - started
    want = Counter(run for run, _, _ in expected.stored)
    wait_until(
        "the fuzz runs' records to be stored",
        progress("stored", lambda: sum(stored_by_run(serve, want).values()), want.total()),
        SETTLE_TIMEOUT_S, 2.0, lambda: f"{stored_by_run(serve, want)} vs {want}",
    )  # fmt: skip
    stored_s = time.perf_counter() - started
    counters = {
        name: serve.counter(name)
        for name in ("ingest_bad_messages", "ingest_bad_records", "ingest_disconnects",
                     "internal_errors", "store_errors")
    }  # fmt: skip
    newer_logged = "upgrade rankwatch on the head node" in serve.output()
    stop.touch()
    codes = [rank.wait(60) for rank in ranks]
    done = dict.fromkeys(range(args.ranks), "finished")
    wait_until("the valid ranks to finish", lambda: serve.rank_states(VALID_RUN) == done, 120)
    assert serve.stop() == 0
    valid = compare(read_store(serve.data, VALID_RUN), read_jsonl(logs / VALID_RUN))
    ok = (
        counters["ingest_bad_messages"] == expected.bad_messages
        and counters["ingest_bad_records"] == expected.bad_records
        and counters["ingest_disconnects"] >= oversized
        and counters["internal_errors"] == counters["store_errors"] == 0
        and newer_logged and codes == [0] * args.ranks
        and valid["missing"] == valid["extra"] == valid["differ"] == 0
    )  # fmt: skip
    idle_ms = [s * 1e3 for s in idle.samples]
    busy_ms = [s * 1e3 for s in busy.samples]
    result = {
        "ok": ok, "messages": expected.messages, "oversized": oversized,
        "sent_s": round(sent_s, 1), "processed_s": round(processed_s, 1),
        "stored_s": round(stored_s, 1),
        "rate_median": statistics.median(rates) if rates else None,
        "rate_p95_low": pct(rates, 0.05),
        "reasons": dict(expected.reasons), "bad_messages": expected.bad_messages,
        "bad_records": expected.bad_records, "fuzz_records_stored": len(expected.stored),
        "valid_ranks": valid, "counters": counters, "newer_version_logged": newer_logged,
        # nan when a short run took no sample (--frames below a few hundred thousand)
        "status_ms_idle": [round(pct(idle_ms, 0.5), 1), round(pct(idle_ms, 0.95), 1)],
        "status_ms_fuzz": [round(pct(busy_ms, 0.5), 1), round(pct(busy_ms, 0.95), 1)],
        "status_failures": busy.failures,
    }  # fmt: skip
    print_table(result)
    return result


def _rate(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/a (fewer messages than one sample)"
    return f"{value:,.0f}/s"


def print_table(r: dict[str, Any]) -> None:
    idle, busy = r["status_ms_idle"], r["status_ms_fuzz"]
    lines = [
        f"fuzz_ingest: {r['messages']:,} messages + {r['oversized']} oversized frames; "
        f"sent in {r['sent_s']} s, all counted after {r['processed_s']} s, "
        f"stored after {r['stored_s']} s",
        f"  send rate per {CHUNK:,}: median {_rate(r['rate_median'])}, "
        f"p95 (slowest 5%) {_rate(r['rate_p95_low'])}",
        "  rejected, by reason (counted == expected): "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(r["reasons"].items())),
        f"  bad messages {r['bad_messages']:,}, bad records {r['bad_records']:,}; "
        f"counters {r['counters']}",
        f"  valid fuzz records stored: {r['fuzz_records_stored']:,} of "
        f"{r['fuzz_records_stored']:,} unique sent",
        f"  real ranks: {r['valid_ranks']}",
        f"  /api/status ms median/p95: baseline {idle[0]}/{idle[1]}, under fuzz "
        f"{busy[0]}/{busy[1]} (ratio {busy[0] / max(idle[0], 1e-9):.1f}x), "
        f"{r['status_failures']} failed",
        f"  newer schema version logged clearly: {r['newer_version_logged']}",
        f"  RESULT: {'PASS' if r['ok'] else 'FAIL'}",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
