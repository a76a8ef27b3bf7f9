"""Per-step cost of ``Monitor.log`` with 6 metrics, side by side with the alternatives.

    python bench/agent_log.py [--steps 3000] [--pace-ms 1.0] [--busy]

Each variant logs the same 6 metrics per step in a loop paced like training (one step every
``--pace-ms``, sleeping in between, or spinning with ``--busy``), after a warm-up; only the
logging call is timed. Variants:

* naive: ``json.dumps(record)`` + ``f.write`` + ``f.flush`` per step (the baseline);
* msgpack + ZeroMQ: ``msgpack.packb(record)`` + DEALER ``send(NOBLOCK)``;
* Monitor, JSONL only (no aggregator address);
* Monitor + aggregator (a ROUTER draining in another process);
* Monitor, aggregator absent (address of a closed port);
* Monitor + aggregator with the sender waking every 1 ms instead of every 20 ms (the cost of
  waking the sender for every record);
* TensorBoard ``add_scalar`` x6 (``torch.utils.tensorboard``; needs the ``tensorboard`` package).

"thread CPU" is the median CPU time of the calling thread inside the call: close to the wall
time means the noise is not descheduling but caches and clocks. "CPU/step over loop" is the
process CPU time per step, background threads included (the sender thread, TensorBoard's
writer thread), minus that of the same loop without logging.
Variants run in rounds of rotating order so the machine's noise falls on all of them alike.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq
from rankwatch.agent import Monitor

WARMUP_STEPS = 200
ROUNDS = 6  # each variant runs steps/ROUNDS steps per round
DRAIN_FLAG = "--drain"

LogFn = Callable[[int, dict[str, float]], None]


def metrics(step: int) -> dict[str, float]:
    return {
        "loss": 2.0 / (1 + step) + 0.01 * math.sin(step),
        "accuracy": 1.0 - 1.0 / (2 + step),
        "lr": 1e-3 * 0.999**step,
        "grad_norm": 1.5 + math.cos(step),
        "tokens_per_s": 12_345.678 + step,
        "loss_scale": 65536.0,
    }


def drain() -> None:
    """The aggregator stand-in: a ROUTER that receives and discards, in its own process."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    while True:
        sock.recv_multipart()


def start_drain() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, DRAIN_FLAG], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, f"tcp://127.0.0.1:{int(proc.stdout.readline())}"


def closed_port() -> str:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.close(linger=0)
    return f"tcp://127.0.0.1:{port}"


class Timing:
    """Samples (ns) and CPU seconds of one variant, gathered over several rounds."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.thread_samples: list[int] = []  # CPU time of the calling thread in the call
        self.cpu_s = 0.0

    def summary(self) -> dict[str, float]:
        samples = sorted(self.samples)
        return {
            "thread": statistics.median(self.thread_samples) / 1e3,
            "median": statistics.median(samples) / 1e3,
            "p99": samples[int(len(samples) * 0.99)] / 1e3,
            "mean": statistics.fmean(samples) / 1e3,
            "cpu": self.cpu_s / len(samples) * 1e6,
        }


def measure(
    log: LogFn, first: int, steps: int, pace_s: float, timing: Timing, busy: bool = False
) -> None:
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    next_tick = time.perf_counter()
    cpu0 = time.process_time()
    for i in range(first, first + steps):
        values = metrics(i)
        c0 = thread_clock()
        t0 = clock()
        log(i, values)
        t1 = clock()
        c1 = thread_clock()
        timing.samples.append(t1 - t0)
        timing.thread_samples.append(c1 - c0)
        next_tick += pace_s  # the rest of a "training step"
        if busy:
            while time.perf_counter() < next_tick:
                pass
        else:
            delay = next_tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    timing.cpu_s += time.process_time() - cpu0


def naive(tmp: Path) -> tuple[LogFn, Callable[[], None]]:
    f = open(tmp / "naive.jsonl", "w")  # noqa: SIM115 (closed by the returned teardown)

    def log(step: int, values: dict[str, float]) -> None:
        record = {"kind": "step", "run": "bench", "rank": 0, "seq": step, "time": time.time()}
        record.update(step=step, metrics=values)
        f.write(json.dumps(record) + "\n")
        f.flush()

    return log, f.close


def msgpack_zmq(addr: str) -> tuple[LogFn, Callable[[], None]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(addr)

    def log(step: int, values: dict[str, float]) -> None:
        record = {"kind": "step", "run": "bench", "rank": 0, "seq": step, "time": time.time()}
        record.update(step=step, metrics=values)
        try:  # noqa: SIM105 (contextlib.suppress would add its own cost to the figure)
            sock.send(msgpack.packb(record), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close() -> None:
        sock.close(linger=0)
        ctx.term()

    return log, close


def monitor(tmp: Path, addr: str | None, flush_s: float | None = None) -> tuple[LogFn, Any]:
    mon = Monitor(run=f"bench-{addr is not None}-{flush_s}", log_dir=tmp, addr=addr)
    if flush_s is not None and mon._sender is not None:
        mon._sender._flush_s = flush_s

    def log(step: int, values: dict[str, float]) -> None:
        mon.log(step, **values)

    return log, mon.close


def tensorboard(tmp: Path) -> tuple[LogFn, Callable[[], None]] | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    writer = SummaryWriter(str(tmp / "tb"))

    def log(step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            writer.add_scalar(name, value, step)

    return log, writer.close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--pace-ms", type=float, default=1.0)
    parser.add_argument(
        "--busy", action="store_true", help="spin between steps instead of sleeping"
    )
    args = parser.parse_args()
    pace = args.pace_ms / 1000
    drain_proc, addr = start_drain()
    timings: dict[str, Timing] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            makers: list[tuple[str, Callable[[], Any]]] = [
                ("no logging (the loop alone)", lambda: (lambda step, values: None, lambda: None)),
                ("naive json.dumps+write+flush", lambda: naive(tmp)),
                ("msgpack + ZeroMQ NOBLOCK", lambda: msgpack_zmq(addr)),
                ("Monitor, JSONL only", lambda: monitor(tmp, None)),
                ("Monitor + aggregator", lambda: monitor(tmp, addr)),
                ("Monitor, aggregator absent", lambda: monitor(tmp, closed_port())),
                ("Monitor + aggregator, 1 ms wake", lambda: monitor(tmp, addr, 0.001)),
                ("TensorBoard add_scalar x6", lambda: tensorboard(tmp)),
            ]
            variants: dict[str, tuple[LogFn, Callable[[], None]]] = {}
            for name, make in makers:
                made = make()
                if made is None:
                    print(f"{name}: skipped (pip install tensorboard)")
                else:
                    variants[name] = made
                    timings[name] = Timing()
            # Rounds in rotating order spread the machine's noise over all variants alike.
            per_round = max(1, args.steps // ROUNDS)
            for log, _ in variants.values():
                measure(log, 0, WARMUP_STEPS, pace, Timing(), args.busy)
            for r in range(ROUNDS):
                names = list(variants)
                names = names[r % len(names) :] + names[: r % len(names)]
                for name in names:
                    first = WARMUP_STEPS + r * per_round
                    measure(variants[name][0], first, per_round, pace, timings[name], args.busy)
            for _, close in variants.values():
                close()
    finally:
        drain_proc.kill()
        drain_proc.wait()
    results = {name: t.summary() for name, t in timings.items()}
    steps = per_round * ROUNDS
    between = "spinning" if args.busy else "sleeping"
    print(f"\n{steps} steps, 6 metrics, a step every {args.pace_ms} ms ({between}); microseconds")
    loop_cpu = results["no logging (the loop alone)"]["cpu"]
    print(
        f"{'variant':34} {'median':>8} {'p99':>8} {'mean':>8} {'thread CPU':>10} "
        f"{'CPU/step over loop':>19}"
    )
    for name, r in results.items():
        cpu = r["cpu"] - loop_cpu
        print(
            f"{name:34} {r['median']:8.2f} {r['p99']:8.2f} {r['mean']:8.2f} {r['thread']:10.2f} "
            f"{cpu:19.1f}"
        )
    naive_r = results["naive json.dumps+write+flush"]
    mon_r = results["Monitor + aggregator"]
    print(f"\nMonitor+aggregator / naive, median: {mon_r['median'] / naive_r['median']:.2f}")
    thread_ratio = mon_r["thread"] / naive_r["thread"]
    print(f"Monitor+aggregator / naive, thread CPU median: {thread_ratio:.2f}")
    print(f"Monitor+aggregator / naive, p99:    {mon_r['p99'] / naive_r['p99']:.2f}")
    jsonl = results["Monitor, JSONL only"]
    print(f"Monitor JSONL only / naive, median: {jsonl['median'] / naive_r['median']:.2f}")
    if "TensorBoard add_scalar x6" in results:
        tb = results["TensorBoard add_scalar x6"]
        print(f"TensorBoard / Monitor+aggregator, median: {tb['median'] / mon_r['median']:.1f}")
        tb_thread = tb["thread"] / mon_r["thread"]
        print(f"TensorBoard / Monitor+aggregator, thread CPU median: {tb_thread:.1f}")


if __name__ == "__main__":
    if sys.argv[1:] == [DRAIN_FLAG]:
        drain()
    else:
        main()
