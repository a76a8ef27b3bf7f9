"""`rankwatch import`: load JSONL histories (agent files, legacy callback logs).

With ``--url`` the records go to a running `rankwatch serve` (``POST /api/ingest``), so they
dedupe against live traffic and show on the dashboard at once; with ``--data`` (the default)
they go straight into a store that no server is using. Each file gets one line: lines read,
records stored, duplicates, lines rejected (the first with its line number and reason).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.cli.status import (
    DEFAULT_URL,
    TOKEN_ENV,
    ApiError,
    request_json,
    server_url,
    token_of,
)

if TYPE_CHECKING:
    from rankwatch.agent.wire.records import Record
    from rankwatch.aggregator.ingest.importer import FileSummary

NAME = "import"
HELP = "import JSONL files or directories (agent logs, legacy callback logs)"
POST_TIMEOUT_S = 120.0  # one batch; the server stores it before answering
MAX_POST_RECORDS = 5000  # records per POST (the server takes up to 200,000)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, description=__doc__)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="*.jsonl files or directories")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--url", help=f"a running server, e.g. {DEFAULT_URL}")
    target.add_argument(
        "--data",
        metavar="DIR",
        help="a data directory no server is using (default ./rankwatch_data)",
    )
    parser.add_argument("--run", help="import every record under this run name")
    parser.add_argument("--token", help=f"API token for --url (or {TOKEN_ENV})")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.set_defaults(func=run)
    return parser


class HttpSink:
    """An importer sink posting batches to ``/api/ingest``; ``add`` returns records new."""

    stores_telemetry = True  # the aggregator takes telemetry records (schema version 2)

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/") + "/api/ingest"
        self.token = token

    def add(self, records: Sequence[Record]) -> int:
        from rankwatch.agent.wire.records import to_json_line

        accepted = 0
        for start in range(0, len(records), MAX_POST_RECORDS):
            chunk = records[start : start + MAX_POST_RECORDS]
            # JSONL lines are already strict JSON with NaN as strings: join, do not re-encode.
            lines = ",".join(to_json_line(r).rstrip("\n") for r in chunk)
            body = f'{{"records":[{lines}]}}'.encode()
            answer = request_json(self.url, self.token, POST_TIMEOUT_S, body)
            accepted += _new_records(answer, len(chunk))
        return accepted


def _new_records(answer: Any, sent: int) -> int:
    if not isinstance(answer, dict):
        raise ApiError("the server's answer to /api/ingest is not a JSON object")
    if answer.get("rejected"):
        first = (answer.get("errors") or [{}])[0]
        raise ApiError(f"the server rejected {answer['rejected']} of {sent} records: {first}")
    result = answer.get("result")
    if isinstance(result, bool) or not isinstance(result, int):
        return int(answer.get("accepted", sent))  # a server that does not tell new from old
    return result


def run(args: argparse.Namespace) -> int:
    from rankwatch.aggregator.ingest.importer import import_into_store, import_paths
    from rankwatch.aggregator.store.db import StoreError

    progress = not args.quiet and sys.stderr.isatty()
    try:
        if args.url:
            sink = HttpSink(server_url(args.url), token_of(args))
            summaries = import_paths(args.paths, sink, progress, run=args.run, stacks=read_stacks)
        else:
            data = Path(args.data or "rankwatch_data")
            summaries = import_into_store(
                args.paths, data, progress, run=args.run, stacks=read_stacks
            )
    except FileNotFoundError as exc:
        return _fail(str(exc))
    except ApiError as exc:
        return _fail(str(exc))
    except StoreError as exc:  # its message already says to import through the server
        return _fail(str(exc))
    problems = 0
    for summary in summaries:
        print(describe(summary))
        if summary.stacks:
            print(f"  {summary.stacks}")
        for bad in summary.bad_lines[1:]:
            print(f"  line {bad.line}: {bad.reason}")
        if summary.bad > len(summary.bad_lines):
            print(f"  ... and {summary.bad - len(summary.bad_lines)} more rejected lines")
        problems += summary.bad + (1 if summary.error else 0)
    total = sum(s.accepted for s in summaries)
    dupes = sum(s.duplicates for s in summaries)
    print(f"imported {total} new records from {len(summaries)} file(s), {dupes} duplicates")
    return 1 if problems else 0


def read_stacks(path: Path, step: int | None) -> dict[str, Any] | None:
    """A ``rank<k>.stacks.txt`` (the agent's faulthandler watchdog) as the rank's stack sample:
    its main thread in the last dump, at the file's modification time."""
    from rankwatch.agent.stacks import parse_faulthandler, sample_of_dump

    text = path.read_text(encoding="utf-8", errors="replace")
    sample = sample_of_dump(parse_faulthandler(text), path.stat().st_mtime, step)
    return None if sample is None else sample.as_dict()


def describe(summary: FileSummary) -> str:
    """One file's line: what was read, stored and rejected, and the first reason why."""
    if summary.error:
        return f"{summary.path}: {summary.error}"
    lines = summary.read + summary.bad
    if not lines:
        return f"{summary.path}: empty file, nothing to import"
    kind = f" ({summary.format} format)" if summary.format in ("legacy", "mixed") else ""
    text = (
        f"{summary.path}{kind}: {_count(lines, 'line')} read, "
        f"{_count(summary.accepted, 'record')} stored, {summary.duplicates:,} already stored, "
        f"{summary.bad:,} rejected"
    )
    if summary.telemetry:
        text += f", {_count(summary.telemetry, 'telemetry record')} skipped (not stored yet)"
    if summary.bad_lines:
        first = summary.bad_lines[0]
        text += f" (first at line {first.line}: {first.reason})"
    return text


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _fail(message: str) -> int:
    print(f"rankwatch import: {message}", file=sys.stderr)
    return 2
