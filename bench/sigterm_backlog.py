"""How long `rankwatch serve` takes to stop on SIGTERM while a peer's frame bomb waits to be
decoded, against the same stop with nothing waiting, in the same run.

Real parts on loopback: ``rankwatch serve`` in a child process (store in a temporary
directory), one attacker DEALER that sends ``--frames`` frames of ``MAX_FRAME_BYTES`` holding
small maps none of which is a record (what a broken or hostile peer sends), then SIGTERM at
once, and the wall time until the process has exited. Median of ``--repeats``.

    python bench/sigterm_backlog.py [--frames 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.frame_bomb import maps_frame
from bench.serve_proc import ServeProc

EXIT_TIMEOUT_S = 120.0  # a stop slower than this is reported as such; the process is killed
SEND_TIMEOUT_MS = 2000


def stop_time(frames: int, frame: bytes) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        serve = ServeProc(Path(tmp) / "data")
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(serve.addr)
        try:
            sent = 0
            for _ in range(frames):
                try:
                    sock.send(frame, copy=False)
                    sent += 1
                except zmq.Again:
                    break
            if frames:
                time.sleep(0.5)  # the frames reach the server's queues
            t0 = time.monotonic()
            serve.proc.send_signal(signal.SIGTERM)
            try:
                serve.proc.wait(EXIT_TIMEOUT_S)
            except Exception:
                serve.proc.kill()
                serve.proc.wait()
            return time.monotonic() - t0
        finally:
            sock.close(0)
            ctx.term()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    frame = maps_frame()
    idle = [stop_time(0, frame) for _ in range(args.repeats)]
    bomb = [stop_time(args.frames, frame) for _ in range(args.repeats)]
    i, b = statistics.median(idle), statistics.median(bomb)
    print(
        f"SIGTERM to exit, median of {args.repeats}: idle {i:.2f} s, "
        f"under a backlog of {args.frames} bomb frames {b:.2f} s (ratio {b / i:.1f}x)"
    )


if __name__ == "__main__":
    main()
