"""`rankwatch relay`: forward this node's ranks to the head node over one connection."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

NAME = "relay"
HELP = "forward this node's agents to the head node over one batched connection"
REPORT_S = 10.0  # counters line period


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help=HELP,
        description=(
            "Run on every worker node of a large job: the node's ranks send to the relay "
            "(set RANKWATCH_ADDR=127.0.0.1:8671 for them), which forwards their records in "
            "batches to the aggregator, so the head node holds one connection per node."
        ),
    )
    parser.add_argument(
        "--listen", default=None, help="where this node's agents connect (default tcp://*:8671)"
    )
    parser.add_argument(
        "--upstream",
        default=None,
        help="the aggregator: HOST[:PORT] or tcp://HOST:PORT (default: RANKWATCH_ADDR, else "
        "MS_SCHED_HOST or MASTER_ADDR at port 8671)",
    )
    parser.add_argument(
        "--batch-ms",
        type=float,
        default=None,
        help="longest time a record waits in the relay, in ms (default 50)",
    )
    parser.add_argument(
        "--max-pending-mb",
        type=float,
        default=None,
        help="frames held while the aggregator is away before agents are pushed back (default 64)",
    )
    parser.add_argument(
        "--curve",
        metavar="DIR",
        help="CurveZMQ on both sides, for a head run with `serve --curve`: DIR is a copy of "
        "the head's `rankwatch keys` directory; agents need the same keys as for the head",
    )
    parser.add_argument(
        "--report-s",
        type=float,
        default=REPORT_S,
        help=f"print counters this often, 0: only at exit (default {REPORT_S:g})",
    )
    parser.set_defaults(func=run)
    return parser


def _fail(message: str) -> int:
    print(f"rankwatch relay: {message}", file=sys.stderr)
    return 2


def format_counters(c: dict[str, Any]) -> str:
    bad = ", ".join(f"{k} {v}" for k, v in sorted(c["reasons"].items())) or "none"
    return (
        f"rankwatch relay: in {c['frames_in']:,} frames / {c['records_in']:,} records "
        f"({c['connections'] - c['disconnects']} agents connected), out {c['frames_out']:,} "
        f"frames / {c['records_out']:,} records, pending {c['pending_frames']} frames "
        f"({c['pending_bytes'] / 1e6:.1f} MB), bad frames {c['bad_frames']} ({bad}), "
        f"control {c['control_routed']} routed / {c['control_unroutable']} unroutable, "
        f"refused agents {c['refused']}"
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rankwatch.relay import forwarder as relay_mod

    try:
        listen = relay_mod.listen_endpoint(args.listen or relay_mod.DEFAULT_LISTEN)
        upstream = relay_mod.upstream_endpoint(args.upstream, dict(os.environ), listen)
        batch_ms = relay_mod.DEFAULT_BATCH_MS if args.batch_ms is None else args.batch_ms
        if not 0 <= batch_ms <= 60_000:
            raise ValueError(f"--batch-ms must be between 0 and 60000, got {batch_ms:g}")
        if args.report_s < 0:
            raise ValueError(f"--report-s must be >= 0, got {args.report_s:g}")
        pending = relay_mod.MAX_PENDING_BYTES
        if args.max_pending_mb is not None:
            pending = int(args.max_pending_mb * 1024 * 1024)
            if pending < relay_mod.MAX_FRAME_BYTES:
                raise ValueError("--max-pending-mb must be at least 4 (one frame)")
        curve = Path(args.curve).expanduser() if args.curve else None
        relay = relay_mod.Relay(
            listen, upstream, batch_ms=batch_ms, max_pending_bytes=pending, curve_dir=curve
        )
    except (ValueError, OSError) as exc:  # CurveError is a ValueError naming the key file
        return _fail(str(exc))

    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    relay.start()
    encrypted = " (CurveZMQ both ways: agents need an allowed client key)" if curve else ""
    print(
        f"rankwatch relay: agents connect to {relay.endpoint}, forwarding to {upstream} "
        f"(batches of up to {batch_ms:g} ms){encrypted}",
        flush=True,
    )
    next_report = time.monotonic() + args.report_s
    while not stop.wait(1.0):  # short waits: the signal handler runs between them
        if args.report_s and time.monotonic() >= next_report:
            next_report += args.report_s
            print(format_counters(relay.counters()), flush=True)
    flushed = relay.stop()
    print(format_counters(relay.counters()), flush=True)
    if not flushed:
        print("rankwatch relay: the aggregator did not take everything before exit", flush=True)
    return 0
