"""`rankwatch policy test`: what a policy would have done on a stored run (a dry run: nothing
is sent), and what was sent to it (the store's commands)."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

NAME = "policy"
HELP = "try a policy on a stored run: what it would have checkpointed or stopped, and when"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True, metavar="test")
    test = sub.add_parser("test", help="dry-run the policies over a stored run", description=HELP)
    test.add_argument("--run", required=True, help="the stored run")
    test.add_argument("--data", metavar="DIR", help="data directory (default ./rankwatch_data)")
    test.add_argument("--config", metavar="FILE", help="TOML config with [[policy]] rules")
    test.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="RULE",
        help="a preset (stop-on-nan, ...) or CAUSE[@STEPS]:ACTION[+ACTION] (repeatable)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from rankwatch.agent.wire.records import StepRecord
    from rankwatch.aggregator.actions.agree import typical_step_time
    from rankwatch.aggregator.actions.dryrun import dry_run
    from rankwatch.aggregator.config import ConfigError, load_config, with_overrides
    from rankwatch.aggregator.store.db import Store, StoreError

    try:
        config = with_overrides(load_config(args.config), data=args.data, policies=args.policy)
    except ConfigError as exc:
        print(f"rankwatch policy: {exc}", file=sys.stderr)
        return 2
    rules = config.policies
    if not rules:
        print("rankwatch policy: no policy given (--policy or [[policy]] in --config); without "
              "one rankwatch only tells (console, webhooks, page): try --policy stop-on-nan",
              file=sys.stderr)  # fmt: skip
        return 2
    path = Path(config.data_dir)
    if not (path / "store.duckdb").exists() and path.suffix != ".duckdb":
        print(f"rankwatch policy: no store in {path} (--data)", file=sys.stderr)
        return 2
    try:
        store = Store(path)
    except StoreError as exc:
        hint = (" (a running `rankwatch serve` holds it: stop it, or copy the data directory "
                "and point --data at the copy)") if exc.reason == "locked" else ""  # fmt: skip
        print(f"rankwatch policy: {exc}{hint}", file=sys.stderr)
        return 2
    try:
        if all(r.get("run") != args.run for r in store.runs()):
            names = ", ".join(sorted(str(r.get("run")) for r in store.runs())[:10]) or "none"
            print(f"rankwatch policy: no stored run {args.run!r} (runs: {names})", file=sys.stderr)
            return 1
        steps = [(r.time, r.step) for r in store.records(args.run) if isinstance(r, StepRecord)]
        incidents = store.incidents(args.run)
        sent = store.commands(args.run)
        step_time = typical_step_time(_step_times(steps))
    finally:
        store.close()
    for rule in rules:
        print(f"policy {rule.name}: {rule.describe()}")
    last = max((s for _, s in steps), default=None)
    print(f"run {args.run}: {len(incidents)} incident(s), last step {last}")
    would = dry_run(rules, incidents, steps, step_time)
    for w in would:
        print("  " + w.line())
    if not would:
        print("  nothing: no incident of the run matches these policies")
    for c in sent:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(c.get("counts", {}).items()))
        print(f"sent: {c['cmd']} at step {c.get('step')} by {c.get('by')} to "
              f"{len(c.get('ranks') or [])} rank(s): {counts or 'recorded'}")  # fmt: skip
    return 0


def _step_times(steps: list[tuple[float, int]]) -> list[float | None]:
    """Seconds per step from the run's own progress (the first 10,000 steps)."""
    by_step: dict[int, float] = {}
    for t, s in steps[:10_000]:
        by_step[s] = min(t, by_step.get(s, t))
    ordered = sorted(by_step.items())
    pairs = itertools.pairwise(ordered)
    return [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in pairs if s1 > s0]
