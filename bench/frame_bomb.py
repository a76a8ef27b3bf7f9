"""Frame bomb: one peer on the ingest port sends frames of absurd shape; how late are a real
rank's records, and how much memory does the server take?

Real parts on loopback: ``rankwatch serve`` in a child process with its store in a temporary
directory, one real ``Monitor`` logging steps over ZeroMQ, and one attacker DEALER sending
frames of at most ``MAX_FRAME_BYTES``: ``tiny`` frames hold millions of one-byte records (not
maps), ``maps`` frames as many small maps as fit, none of them a valid record. A step's delay is
the wall time from ``Monitor.log()`` to the step's point on the live stream (``/api/stream``),
measured first with no attacker (the baseline) and then while the attacker sends, in the same
run. RSS is the server's, from /proc, before and after each phase (and its peak).

    python bench/frame_bomb.py [--frames 40] [--steps 30] [--interval 0.1] [--kind both]

Bounded: the attacker sends at most ``--frames`` frames, each phase waits at most
``--max-wait`` seconds for its last step, and the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from rankwatch.agent import Monitor
from rankwatch.agent.wire.records import MAX_FRAME_BYTES, SCHEMA_VERSION

from bench.serve_proc import ServeProc
from bench.stream import step_arrivals

RUN = "frame-bomb"
METRIC = "loss"
SEND_TIMEOUT_MS = 2000  # the attacker gives up on a frame the server does not take


def tiny_frame() -> bytes:
    """As many one-byte records (positive fixints) as fit in MAX_FRAME_BYTES."""
    n = MAX_FRAME_BYTES - 64
    return msgpack.packb({"v": SCHEMA_VERSION, "records": [0] * n})


def maps_frame() -> bytes:
    """As many small maps as fit, each shaped like a step record but lacking its fields."""
    item = {"kind": "step", "run": "x", "rank": 0, "seq": 1, "time": 0.0, "host": "h", "pid": 0,
            "step": 0, "epoch": None, "world_size": 1}  # fmt: skip
    size = len(msgpack.packb(item))
    n = (MAX_FRAME_BYTES - 64) // size
    return msgpack.packb({"v": SCHEMA_VERSION, "records": [item] * n})


def attack(
    addr: str, frames: list[bytes], count: int, done: threading.Event, sent: list[int]
) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        for i in range(count):
            if done.is_set():
                return
            try:
                sock.send(frames[i % len(frames)], copy=False)
            except zmq.Again:
                continue  # the server's queue for this peer is full: that is the point
            sent[0] += 1
        done.wait()  # closing now would discard what ZeroMQ has not yet written
    finally:
        sock.close(0)


def phase(
    mon: Monitor, first_step: int, steps: int, interval: float, seen: dict[int, float],
    max_wait: float,
) -> list[float]:  # fmt: skip
    logged: dict[int, float] = {}
    for i in range(steps):
        step = first_step + i
        logged[step] = time.time()
        mon.log(step, loss=1.0 + 0.001 * i)
        time.sleep(interval)
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline and not all(s in seen for s in logged):
        time.sleep(0.05)
    # A step not seen by the deadline counts with the full wait: a lower bound of its delay.
    end = time.time()
    return [seen.get(s, end) - t for s, t in logged.items()]


def show(name: str, delays: list[float], missing: int, rss0: int, rss1: int, peak: int) -> None:
    p50 = statistics.median(delays)
    print(
        f"{name:9s} delay p50 {p50 * 1000:8.1f} ms  max {max(delays) * 1000:8.1f} ms  "
        f"not arrived {missing}  RSS {rss0 / 2**20:6.0f} -> {rss1 / 2**20:6.0f} MiB "
        f"(peak {peak / 2**20:.0f} MiB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=40, help="bomb frames sent (at most)")
    parser.add_argument("--steps", type=int, default=30, help="real steps logged per phase")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between steps")
    parser.add_argument("--kind", choices=("tiny", "maps", "both"), default="both")
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds per phase")
    args = parser.parse_args()
    kinds = {"tiny": [tiny_frame()], "maps": [maps_frame()]}
    frames = kinds["tiny"] + kinds["maps"] if args.kind == "both" else kinds[args.kind]
    with tempfile.TemporaryDirectory() as tmp, ServeProc(Path(tmp) / "data") as serve:
        url = f"http://127.0.0.1:{serve.http_port}"
        seen: dict[int, float] = {}
        stop, ready = threading.Event(), threading.Event()
        threading.Thread(
            target=step_arrivals, args=(url, RUN, METRIC, seen, stop, ready), daemon=True
        ).start()
        ready.wait(10)
        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.05):
                peak[0] = max(peak[0], serve.rss_bytes())

        threading.Thread(target=sample, daemon=True).start()
        results = {}
        with Monitor(RUN, 0, 1, addr=serve.addr, log_dir=Path(tmp) / "logs") as mon:
            mon.log(0, loss=1.0)  # connect and let the run appear before measuring
            time.sleep(1.0)
            rss0 = serve.rss_bytes()
            peak[0] = rss0
            base = phase(mon, 1, args.steps, args.interval, seen, args.max_wait)
            rss1 = serve.rss_bytes()
            results["baseline"] = (base, rss0, rss1, peak[0])
            done, sent = threading.Event(), [0]
            attacker = threading.Thread(
                target=attack, args=(serve.addr, frames, args.frames, done, sent), daemon=True
            )
            peak[0] = rss1
            attacker.start()
            time.sleep(0.5)  # the backlog builds before the real steps come
            under = phase(mon, 10_000, args.steps, args.interval, seen, args.max_wait)
            done.set()
            attacker.join(SEND_TIMEOUT_MS / 1000 + 1)
            rss2 = serve.rss_bytes()
            results["attack"] = (under, rss1, rss2, peak[0])
        sampling.set()
        stop.set()
        counters = serve.counters()
    print(f"attacker: {sent[0]} of {args.frames} frames sent ({args.kind}, "
          f"{len(frames[0])} bytes each)")  # fmt: skip
    for name, (delays, before, after, top) in results.items():
        missing = sum(1 for d in delays if d >= args.max_wait)
        show(name, delays, missing, before, after, top)
    ratio = max(results["attack"][0]) / max(max(results["baseline"][0]), 1e-6)
    print(f"max delay under attack / baseline: {ratio:.1f}x")
    keys = ("ingest_bad_messages", "ingest_bad_records", "ingest_messages", "ingest_records")
    print("server counters:", {k: counters.get(k) for k in keys})
    return 0


if __name__ == "__main__":
    sys.exit(main())
