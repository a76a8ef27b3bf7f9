"""Time until a real agent's record is stored after a flood of one-record runs arrives.

A real ``Aggregator`` (store in a temporary data dir, ZeroMQ ingest on 127.0.0.1, port 0)
takes ``--runs`` distinct runs of one step record each through ``add()`` (what one
``POST /api/ingest`` body does), then a real ``Monitor`` logs one step to the ingest port.
Printed: the seconds until that record is in the store, against the same measured first on
an idle aggregator in the same run (the baseline), and the ratio; then how long ``stop()``
(what SIGTERM runs) took. Bounded: each wait gives up after ``--limit-s``, and a stop that
does not end in that time is left to the process's exit.

    python bench/many_runs.py [--runs 10000] [--limit-s 120]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.service import Aggregator, ServeConfig

POLL_S = 0.05


def flood(runs: int) -> list[StepRecord]:
    now = time.time()
    return [
        StepRecord(f"flood{i}", 0, 1, now, 1, "h", 1, 0, None, {"loss": 1.0}) for i in range(runs)
    ]


def time_to_store(
    runs: int, limit_s: float, log_dir: Path, data: str
) -> tuple[float | None, float | None]:
    """Seconds from a real agent's log() to its record in the store, and of the stop after;
    None past ``limit_s``."""
    cfg = ServeConfig(
        data_dir=Path(data), ingest_host="127.0.0.1", ingest_port=0, console_alerts=False
    )
    agg = Aggregator(cfg)
    agg.start()
    try:
        if runs:
            agg.add(flood(runs), imported=False)
        run = f"real{runs}"
        mon = Monitor(run=run, rank=0, world_size=1, addr=f"127.0.0.1:{agg.ingest_port}",
                      log_dir=log_dir, heartbeat_s=60.0)  # fmt: skip
        t0 = time.monotonic()
        mon.log(1, loss=0.5)
        try:
            while time.monotonic() - t0 < limit_s:
                if any(r["run"] == run for r in agg.store.runs()):
                    stored = time.monotonic() - t0
                    break
                time.sleep(POLL_S)
            else:
                stored = None
        finally:
            mon.close()
    finally:
        stopper = threading.Thread(target=agg.stop, daemon=True)
        t1 = time.monotonic()
        stopper.start()
        stopper.join(limit_s)
        stopped = None if stopper.is_alive() else time.monotonic() - t1
    return stored, stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--limit-s", type=float, default=120.0)
    args = parser.parse_args()

    def show(t: float | None) -> str:
        return f"> {args.limit_s:.0f} s" if t is None else f"{t:.2f} s"

    print(f"cpus: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory() as logs, tempfile.TemporaryDirectory() as data:
        base, base_stop = time_to_store(0, args.limit_s, Path(logs), data + "/idle")
        print(f"real record stored, idle aggregator (baseline): {show(base)}; "
              f"stop {show(base_stop)}", flush=True)  # fmt: skip
        flooded, stop = time_to_store(args.runs, args.limit_s, Path(logs), data + "/flood")
        print(f"real record stored, after {args.runs:,} one-record runs: {show(flooded)}; "
              f"stop {show(stop)}", flush=True)  # fmt: skip
        if base is not None:
            ratio = (args.limit_s if flooded is None else flooded) / base
            print(f"ratio flood / baseline: {'>' if flooded is None else ''}{ratio:.1f}x")
        if stop is None:
            os._exit(1)  # the aggregator is still stopping: do not wait on it


if __name__ == "__main__":
    main()
