"""Where the soak's CPU per record goes: the soak's load captured, then replayed by stage.

    python bench/soak_stages.py [--ranks 1024] [--rate 5] [--duration 30] [--flush-s 2]

Sends ``--duration`` seconds of ``scale_soak.py``'s load (``--sockets process``, the same fault
mix) to a ROUTER in this process that keeps every frame with its arrival time, then replays the
frames through a real ``Aggregator`` (store in a temporary directory, a feed subscriber standing
in for an open page) on the recorded clock: decode, ``add``, a tick every ``FLUSH_INTERVAL_S``,
the stream's JSON of every message the tick published, and a store flush every ``--flush-s``.
Prints the CPU per record of each stage (thread CPU; the flush's is the process's, DuckDB's
threads included) beside msgspec decoding the same frames and nothing else, timed in the same
run. No sockets and one thread during the replay, so a busy machine distorts it less than the
soak; the soak's own figure is ``scale_soak.py``'s.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import zmq
from loadgen import LoadConfig, LoadGen, add_arguments, config_from_args
from rankwatch.aggregator.ingest import frames as aggregator_frames
from rankwatch.aggregator.service import FLUSH_INTERVAL_S, Aggregator, ServeConfig, tune_gc
from rankwatch.dashboard.jsonenc import dumps_fast

DEFAULT_FAULTS = "drift:17:4,nan:5,slow:40:2,hang:77,lost:100"


def capture(config: LoadConfig) -> list[tuple[float, bytes]]:
    """The frames the load sends, with the wall time each arrived."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    config.addrs = [f"tcp://127.0.0.1:{port}"]
    got: list[tuple[float, bytes]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            if sock.poll(100):
                got.append((time.time(), sock.recv_multipart()[1]))
        while sock.poll(0):
            got.append((time.time(), sock.recv_multipart()[1]))

    reader = threading.Thread(target=read)
    reader.start()
    gen = LoadGen(config)
    gen.start()
    gen.wait()
    time.sleep(1.0)  # the last frames in flight
    done.set()
    reader.join()
    sock.close(0)
    ctx.term()
    return got


def replay(frames: list[tuple[float, bytes]], flush_s: float) -> tuple[int, dict[str, float]]:
    cpu = dict.fromkeys(("decode", "add", "tick", "stream JSON", "flush"), 0.0)
    clock = time.thread_time
    start = frames[0][0]
    shift = time.time() - frames[-1][0]  # the recorded clock, ending now
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServeConfig(data_dir=Path(tmp), console_alerts=False, resend_gaps=False)
        agg = Aggregator(cfg)
        tune_gc()
        page = agg.feed.subscribe(maxsize=10**7)
        next_tick, next_flush = start + FLUSH_INTERVAL_S, start + flush_s
        for at, frame in frames:
            while at >= next_tick:
                t = clock()
                agg.tick(next_tick + shift)
                cpu["tick"] += clock() - t
                t = clock()
                for message in page.drain(10**7):
                    dumps_fast(message)
                cpu["stream JSON"] += clock() - t
                next_tick += FLUSH_INTERVAL_S
            if at >= next_flush:
                t = time.process_time()
                agg.store.flush()
                cpu["flush"] += time.process_time() - t
                next_flush += flush_s
            t = clock()
            records = aggregator_frames.decode_frame_blocks(frame)
            cpu["decode"] += clock() - t
            t = clock()
            n += agg.add(records, imported=False, now=at + shift)
            cpu["add"] += clock() - t
        t = time.process_time()
        agg.store.flush()
        cpu["flush"] += time.process_time() - t
        agg.store.close()
    return n, cpu


def bare(frames: list[tuple[float, bytes]]) -> float:
    decode = msgspec.msgpack.decode
    t = time.thread_time()
    for _, frame in frames:
        decode(frame)
    return time.thread_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.set_defaults(duration=30.0, sockets="process", faults=DEFAULT_FAULTS)
    ap.add_argument("--flush-s", type=float, default=2.0, help="store flush period")
    args = ap.parse_args()
    config = config_from_args(args)
    frames = capture(config)
    n, cpu = replay(frames, args.flush_s)
    base = bare(frames)
    total = sum(cpu.values())
    print(f"soak_stages: {config.ranks:,} ranks x {config.rate:g} steps/s x {config.duration:g} s, "
          f"{len(frames):,} frames, {n:,} records, a flush every {args.flush_s:g} s")  # fmt: skip
    for stage, s in cpu.items():
        print(f"  {stage:12} {s / n * 1e6:6.2f} us/record ({s / total:4.0%})")
    print(
        f"  {'total':12} {total / n * 1e6:6.2f} us/record; msgspec decode alone (baseline, "
        f"same frames) {base / n * 1e6:.2f} us/record: {total / max(base, 1e-9):.0f}x"
    )


if __name__ == "__main__":
    main()
