"""One training rank for the fault tests: a real ``Monitor`` in its own process.

``python rank_proc.py --run R --rank K --world N --addr HOST:PORT --log-dir DIR`` logs one
step every ``--interval`` seconds until ``--steps`` are done or ``--stop-file`` exists, then
closes the monitor and prints ``done <last step>``. The loss is a pure function of rank and
step, so a test can check values. ``--curve-dir`` (or ``RANKWATCH_CURVE_DIR``) turns on
CurveZMQ when the agent supports it.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from rankwatch.agent import Monitor


def loss(rank: int, step: int) -> float:
    return 2.0 / (1.0 + 0.01 * step) + 0.001 * rank


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--stop-file", default=None)
    parser.add_argument("--curve-dir", default=None)
    args = parser.parse_args()
    extra = {"curve_dir": args.curve_dir} if args.curve_dir else {}
    mon = Monitor(
        run=args.run, rank=args.rank, world_size=args.world, addr=args.addr,
        log_dir=args.log_dir, heartbeat_s=args.heartbeat, **extra,
    )  # fmt: skip
    print(f"started {mon.jsonl_path}", flush=True)
    stop = Path(args.stop_file) if args.stop_file else None
    step = 0
    next_at = time.monotonic()
    while step < args.steps and not (stop is not None and stop.exists()):
        step += 1
        value = loss(args.rank, step)
        mon.log(step, loss=value, nonfinite=math.nan if step % 50 == 0 else value)
        next_at += args.interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    mon.close()
    print(f"done {step}", flush=True)


if __name__ == "__main__":
    main()
