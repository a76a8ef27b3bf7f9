"""One training rank for the browser tests and the freshness bench: a real Monitor process.

Run as ``python rank_agent.py --run NAME --rank K --world N --addr HOST:PORT --log-dir DIR``.
It reads JSON lines on stdin, one per call: ``{"step": 5, "metrics": {"loss": 1.0}}`` calls
``mon.log``, ``{"event": "crash", "step": 5}`` calls ``mon.event``, ``{"close": true}`` closes.
Non-finite values come as bare ``NaN``/``Infinity`` tokens (Python's json reads them). After
each line it prints ``ok <wall time of the call>`` so the caller knows when log() ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rankwatch.agent import Monitor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--log-dir", required=True)
    args = parser.parse_args()
    mon = Monitor(
        run=args.run, rank=args.rank, world_size=args.world, addr=args.addr,
        log_dir=args.log_dir, heartbeat_s=1.0,
    )  # fmt: skip
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("close"):
            break
        t = time.time()
        if "event" in cmd:
            mon.event(cmd["event"], cmd.get("step"), **cmd.get("info", {}))
        else:
            mon.log(cmd["step"], **cmd["metrics"])
        print(f"ok {t!r}", flush=True)
    mon.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
