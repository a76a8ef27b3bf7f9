"""`rankwatch demo`: watch a real 4-rank MindSpore job (or simulated ranks) with one bad rank."""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwatch.demo.launcher import DEFAULT_NODE_TIMEOUT_S, FAULTS, DemoConfig, run_demo

NAME = "demo"
HELP = "run a demo job with one bad rank and the dashboard (Ctrl-C stops everything)"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help=HELP,
        description=(
            "Start `rankwatch serve`, launch a MindSpore data-parallel job with msrun (4 CPU "
            "ranks) in which one rank goes bad at a given step, and watch it on the dashboard. "
            "Ctrl-C stops every process the demo started."
        ),
    )
    parser.add_argument(
        "--fault",
        choices=FAULTS,
        default="labels",
        help="labels: corrupted labels (y+1)%%5; nan: NaN loss; slow: extra sleep per step; "
        "hang: sleeps forever; crash: raises; sdc: its gradients 1.5x before the all-reduce "
        "(default: labels)",
    )
    parser.add_argument("--fault-rank", type=int, default=2, help="the bad rank (default 2)")
    parser.add_argument("--fault-step", type=int, default=20, help="first bad step (default 20)")
    parser.add_argument("--ranks", type=int, default=4, help="number of ranks (default 4)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument(
        "--step-sleep",
        type=float,
        default=0.2,
        help="seconds each step sleeps, so the run can be watched live (default 0.2)",
    )
    parser.add_argument("--port", type=int, default=8670, help="dashboard HTTP port (8670)")
    parser.add_argument("--ingest-port", type=int, default=8671, help="ZeroMQ ingest port (8671)")
    parser.add_argument(
        "--data",
        type=Path,
        default=Path("rankwatch_data") / "demo",
        help="demo data directory: store, JSONL logs, job logs (default rankwatch_data/demo)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="synthetic ranks (real agents, same ZeroMQ path) instead of MindSpore",
    )
    parser.add_argument(
        "--no-serve-wait",
        dest="serve_wait",
        action="store_false",
        help="launch the ranks without waiting for the aggregator to answer first",
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="when the job ends (or the injected hang shows), print a summary, stop, exit 0",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds even if the job still runs",
    )
    parser.add_argument(
        "--node-timeout",
        type=int,
        default=DEFAULT_NODE_TIMEOUT_S,
        help=f"MS_NODE_TIMEOUT for msrun, seconds (default {DEFAULT_NODE_TIMEOUT_S})",
    )
    parser.add_argument(
        "--lost-after",
        type=float,
        default=None,
        help="passed to `rankwatch serve`: seconds of silence before a rank counts as lost",
    )
    parser.add_argument(
        "--min-stall",
        type=float,
        default=None,
        help="passed to `rankwatch serve --min-stall-s`: seconds without a new step before a "
        "rank counts as stalled (default 30); the hang fault shows (and, with --exit-when-done, "
        "ends the demo) that soon",
    )
    parser.add_argument(
        "--policy",
        help="act on the incident: a `serve --policy` rule such as stop-on-nan (checkpoint, "
        "then stop every rank); the ranks accept checkpoint and stop. Says how many steps "
        "the stop saved",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    cfg = DemoConfig(
        fault=args.fault,
        fault_rank=args.fault_rank,
        fault_step=args.fault_step,
        ranks=args.ranks,
        steps=args.steps,
        step_sleep=args.step_sleep,
        port=args.port,
        ingest_port=args.ingest_port,
        data=args.data,
        simulate=args.simulate,
        serve_wait=args.serve_wait,
        exit_when_done=args.exit_when_done,
        duration=args.duration,
        node_timeout_s=args.node_timeout,
        lost_after_s=args.lost_after,
        min_stall_s=args.min_stall,
        policy=args.policy,
    )
    return run_demo(cfg)
