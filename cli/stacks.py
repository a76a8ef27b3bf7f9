"""`rankwatch stacks`: where the ranks of a run were when they stalled, grouped by stack, the odd
ones out marked (from a running `rankwatch serve`: ``GET /api/run/stacks``)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse

from rankwatch.cli.status import (
    DEFAULT_URL,
    TIMEOUT_S,
    TOKEN_ENV,
    ApiError,
    request_json,
    server_url,
    token_of,
)

NAME = "stacks"
HELP = "print where each rank of a run was when it stalled, grouped (from `rankwatch serve`)"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, description=__doc__)
    parser.add_argument("--run", required=True, help="the run")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"server URL (default {DEFAULT_URL})")
    parser.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    parser.add_argument("--token", help=f"API token, if the server wants one (or {TOKEN_ENV})")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds (default 10)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        query = urllib.parse.urlencode({"run": args.run})
        url = f"{server_url(args.url)}/api/run/stacks?{query}"
        answer = request_json(url, token_of(args), args.timeout)
    except ApiError as exc:
        print(f"rankwatch stacks: {exc}", file=sys.stderr)
        return 1 if "HTTP 404" in str(exc) else 2
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
        print(f"rankwatch stacks: {url} did not answer stack samples", file=sys.stderr)
        return 2
    if args.json:
        json.dump(answer, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(answer["text"].rstrip("\n") + "\n")
    return 0
