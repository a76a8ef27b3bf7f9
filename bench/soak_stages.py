"""Where the soak's CPU per record goes: the soak's load captured, then replayed by stage.

    python bench/soak_stages.py [--ranks 1024] [--rate 5] [--duration 30] [--flush-s 2]
        [--before DIR] [--repeats 3]

Sends ``--duration`` seconds of ``scale_soak.py``'s load (``--sockets process``, the same fault
mix) to a ROUTER in this process that keeps every frame with its arrival time, then replays the
frames through a real ``Aggregator`` (store in a temporary directory, a feed subscriber standing
in for an open page) on the recorded clock: decode, ``add``, a tick every ``FLUSH_INTERVAL_S``,
the stream's JSON of every message the tick published, and a store flush every ``--flush-s``.
Prints the CPU per record of each stage (thread CPU; the flush's is the process's, DuckDB's
threads included) beside msgspec decoding the same frames and nothing else, timed in the same
run. No sockets and one thread during the replay, so a busy machine distorts it less than the
soak; the soak's own figure is ``scale_soak.py``'s.

``--before DIR``: DIR holds an earlier version's store package (``DIR/aggregator/store``, e.g.
``git archive main aggregator/store | tar -x -C DIR``); the same captured frames are replayed
through it and through this tree's, alternately (``--repeats`` each, before first), each replay
in a fresh process, and the medians are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import zmq
from loadgen import LoadConfig, LoadGen, add_arguments, config_from_args
from rankwatch.aggregator.ingest import frames as aggregator_frames
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
    # imported here: a replay of an earlier store (--before) points the package elsewhere first
    from rankwatch.aggregator.service import FLUSH_INTERVAL_S, Aggregator, ServeConfig, tune_gc

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
            records = aggregator_frames.decode_frame_ranks(frame)
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


def replay_in_child(frames_path: Path, flush_s: float, store: Path | None) -> dict:
    """One replay in a fresh process (``store``: the store package to use instead of this
    tree's); its figures as a dict."""
    cmd = [sys.executable, __file__, "--replay", str(frames_path), "--flush-s", str(flush_s)]
    if store is not None:
        cmd += ["--store-package", str(store)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def child(frames_path: Path, flush_s: float, store: str | None) -> None:
    if store is not None:
        import rankwatch.aggregator.store as package

        package.__path__[:] = [store]
    frames = pickle.loads(frames_path.read_bytes())
    n, cpu = replay(frames, flush_s)
    print(json.dumps({"n": n, "cpu": cpu, "base": bare(frames)}))


def report(name: str, runs: list[dict]) -> dict[str, float]:
    """Medians per stage in us/record (and the baseline's), printed with each run's."""
    per = {stage: [r["cpu"][stage] / r["n"] * 1e6 for r in runs] for stage in runs[0]["cpu"]}
    per["total"] = [sum(r["cpu"].values()) / r["n"] * 1e6 for r in runs]
    per["baseline"] = [r["base"] / r["n"] * 1e6 for r in runs]
    per["ratio"] = [t / b for t, b in zip(per["total"], per["baseline"], strict=True)]
    print(f"{name}: {len(runs)} replay(s), {runs[0]['n']:,} records each")
    for stage, vals in per.items():
        each = ", ".join(f"{v:.2f}" for v in vals)
        print(f"  {stage:12} median {statistics.median(vals):7.2f} ({each})")
    return {stage: statistics.median(vals) for stage, vals in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.set_defaults(duration=30.0, sockets="process", faults=DEFAULT_FAULTS)
    ap.add_argument("--flush-s", type=float, default=2.0, help="store flush period")
    ap.add_argument("--before", type=Path, help="folder holding an earlier aggregator/store")
    ap.add_argument("--repeats", type=int, default=1, help="replays per version (--before)")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--store-package", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay is not None:
        child(args.replay, args.flush_s, args.store_package)
        return
    try:
        config = config_from_args(args)
        config.check()
    except ValueError as exc:  # e.g. a default fault's rank beyond a small --ranks
        ap.error(f"{exc} (--faults names the fault ranks)")
    frames = capture(config)
    if args.before is not None:
        package = args.before / "aggregator" / "store"
        if not (package / "db.py").is_file():
            ap.error(f"--before: no store package at {package}")
        print(f"soak_stages: {config.ranks:,} ranks x {config.rate:g} steps/s x "
              f"{config.duration:g} s, {len(frames):,} frames, a flush every {args.flush_s:g} s; "
              f"versions alternate, before first")  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "frames.pickle"
            path.write_bytes(pickle.dumps(frames))
            runs: dict[str, list[dict]] = {"before": [], "this tree": []}
            for _ in range(max(1, args.repeats)):
                runs["before"].append(replay_in_child(path, args.flush_s, package))
                runs["this tree"].append(replay_in_child(path, args.flush_s, None))
        medians = {name: report(name, got) for name, got in runs.items()}
        b, a = medians["before"], medians["this tree"]
        print(f"  flush: {b['flush']:.2f} -> {a['flush']:.2f} us/record "
              f"({a['flush'] / b['flush']:.2f}x); total {b['total']:.2f} -> {a['total']:.2f}; "
              f"ratio to the baseline {b['ratio']:.0f}x -> {a['ratio']:.0f}x")  # fmt: skip
        return
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
