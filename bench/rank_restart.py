"""Records lost when a rank restarts without its old JSONL (another log dir, node or container).

    python bench/rank_restart.py [--restarts 1] [--steps 100]

One real aggregator on 127.0.0.1 (port 0, a temporary data dir) and real Monitors on run
``reuse``, rank 0: the first in log dir 0, each restart in a new log dir, ``--steps`` steps each.
Prints the steps logged and stored, the records lost and the restart events stored; the
baseline is what the ranks logged in the same run. Bounded: at most 10 restarts of at most
10,000 steps, and 30 s of waiting for the aggregator.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rankwatch.agent.monitor import Monitor
from rankwatch.aggregator.service import Aggregator, ServeConfig

RUN = "reuse"
WAIT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=1, choices=range(0, 11))
    parser.add_argument("--steps", type=int, default=100, choices=range(1, 10_001))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = ServeConfig(data_dir=root / "data", ingest_host="127.0.0.1", ingest_port=0,
                          console_alerts=False, flush_interval_s=0.05)  # fmt: skip
        with Aggregator(cfg) as agg:
            addr = f"127.0.0.1:{agg.ingest_port}"
            logged = records = 0
            for life in range(args.restarts + 1):
                mon = Monitor(run=RUN, rank=0, world_size=1, addr=addr,
                              log_dir=root / f"logs{life}", heartbeat_s=60.0)  # fmt: skip
                for i in range(args.steps):
                    mon.log(life * args.steps + i + 1, loss=1.0 / (i + 1))
                mon.close()
                logged += args.steps
                records += args.steps + 2  # and its start and end events
                deadline = time.monotonic() + WAIT_S  # one process after the other, as in life
                while agg.counters()["records_received"] < records:
                    if time.monotonic() > deadline:
                        print("the aggregator did not receive every record in time")
                        return 1
                    time.sleep(0.02)
            agg.flush_store()
            series = agg.store.series(RUN, "loss", max_points=logged + 1).get(0)
            stored = len(set(series["step"])) if series else 0
            restarts = sum(e["event"] == "restart" for e in agg.store.events(RUN))
            duplicates = agg.counters()["records_duplicates"]
    print(f"{args.restarts} restart(s) without the old JSONL, {args.steps} steps per process")
    print(f"steps logged {logged:,}  stored {stored:,}  lost {logged - stored:,}")
    print(f"records counted as duplicates {duplicates:,}  restart events stored {restarts}")
    print(f"ratio stored/logged {stored / logged:.3f}")
    return 0 if stored == logged else 1


if __name__ == "__main__":
    sys.exit(main())
