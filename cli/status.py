"""`rankwatch status`: the runs and ranks a running `rankwatch serve` sees, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

NAME = "status"
HELP = "print the live state of every run and rank (from a running `rankwatch serve`)"
DEFAULT_URL = "http://127.0.0.1:8670"
TOKEN_ENV = "RANKWATCH_TOKEN"
TIMEOUT_S = 10.0
KNOWN_RUNS_SHOWN = 5  # runs named when --run matches none


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    parser.add_argument("--url", default=DEFAULT_URL, help=f"server URL (default {DEFAULT_URL})")
    parser.add_argument("--run", help="only this run")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    parser.add_argument(
        "--all",
        action="store_true",
        help="a row for every rank (runs of more than 64 ranks otherwise list only the ranks "
        "that are not alive, divergent, or missing records; a run of more than 1,024 is read "
        "from the server a page at a time)",
    )
    parser.add_argument(
        "--compare",
        nargs="?",
        const="",
        metavar="REF",
        help="with --run: its median per metric against run REF's at the same steps (without "
        "REF: the previous run of the same job)",
    )
    parser.add_argument("--token", help=f"API token, if the server wants one (or {TOKEN_ENV})")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds (default 10)")
    parser.set_defaults(func=run)
    return parser


class ApiError(Exception):
    """The server could not be reached or refused; the message says what to do."""


def server_url(text: str) -> str:
    """``text`` as the base URL of a server, without a trailing slash; ApiError if it is not
    an http(s) URL with a host."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        like = f"http://{text.strip()}" if "://" not in text and text.strip() else DEFAULT_URL
        raise ApiError(f"--url {text!r} is not an http:// or https:// URL (like {like})")
    return text.strip().rstrip("/")


def request_json(
    url: str,
    token: str | None,
    timeout: float,
    body: bytes | None = None,
) -> Any:
    """GET (or POST ``body``) ``url`` and decode the JSON answer; ApiError on any failure."""
    headers = {"Accept": "application/json", "User-Agent": "rankwatch-cli"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        request = urllib.request.Request(url, data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        detail = detail_of(exc)
        exc.close()
        if exc.code in (401, 403):
            hint = "a valid --token" if token else f"a token: pass --token or set {TOKEN_ENV}"
            raise ApiError(f"{url}: HTTP {exc.code}: the server wants {hint}") from None
        raise ApiError(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise ApiError(
            f"cannot reach rankwatch at {url}: {exc.reason} (is `rankwatch serve` running? --url)"
        ) from None
    except (TimeoutError, OSError) as exc:
        raise ApiError(f"{url}: {exc}") from None
    except ValueError:
        raise ApiError(f"{url}: the answer is not JSON (is this a rankwatch server?)") from None


def detail_of(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(65536) or b"{}")
    except (ValueError, OSError):
        return exc.reason or "error"
    detail = body.get("detail") if isinstance(body, dict) else None
    return str(detail or exc.reason or "error")[:500]


def token_of(args: argparse.Namespace) -> str | None:
    return args.token or os.environ.get(TOKEN_ENV) or None


def run(args: argparse.Namespace) -> int:
    from rankwatch.aggregator.alerts.console import render_status

    if args.compare is not None:
        return compare(args)
    try:
        url = server_url(args.url) + "/api/status"
        query = f"?{urllib.parse.urlencode({'run': args.run})}" if args.run is not None else ""
        snapshot = request_json(url + query, token_of(args), args.timeout)
    except ApiError as exc:
        print(f"rankwatch status: {exc}", file=sys.stderr)
        return 2
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("runs"), list):
        print(f"rankwatch status: {url} did not answer a snapshot", file=sys.stderr)
        return 2
    if args.run is not None:
        known = snapshot["runs"]
        snapshot = {**snapshot, "runs": [r for r in known if r.get("run") == args.run]}
        if not snapshot["runs"]:
            try:  # the runs it could have been
                known = request_json(url, token_of(args), args.timeout).get("runs") or []
            except (ApiError, AttributeError):
                known = []
            print(f"rankwatch status: {no_such_run(args.run, known)}", file=sys.stderr)
            return 1
    if args.all:
        try:
            snapshot = every_rank(url, snapshot, token_of(args), args.timeout)
        except ApiError as exc:
            print(f"rankwatch status: {exc}", file=sys.stderr)
            return 2
    if args.json:
        json.dump(snapshot, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(render_status(snapshot, args.run, snapshot.get("now"), args.all))
        lines = hardware_lines(server_url(args.url), snapshot, token_of(args), args.timeout)
        if lines:
            print("\n" + "\n".join(lines))
        if args.run is not None:
            print_commands(server_url(args.url), args.run, token_of(args), args.timeout)
    return 0


HARDWARE_RUNS = 5  # live runs whose cards status describes
PAGE_RANKS = 10_000  # ranks per request when --all reads a summarised run's every rank


def every_rank(url: str, snapshot: dict[str, Any], token: str | None, timeout: float) -> Any:
    """``snapshot`` with every rank of each summarised run (a run of many ranks, which the
    server lists as counts and its odd ranks), read from ``url`` a page at a time."""
    runs = []
    for entry in snapshot["runs"]:
        if isinstance(entry, dict) and entry.get("ranks_summarised"):
            ranks: list[Any] = []
            while True:
                query = urllib.parse.urlencode(
                    {"run": entry.get("run"), "offset": len(ranks), "limit": PAGE_RANKS}
                )
                page = request_json(f"{url}?{query}", token, timeout)
                found = [r for r in page.get("runs") or [] if r.get("run") == entry.get("run")]
                got = (found[0].get("ranks") or []) if found else []
                ranks += got
                if len(got) < PAGE_RANKS:
                    break
            entry = {**entry, "ranks": ranks, "ranks_summarised": False}
        runs.append(entry)
    return {**snapshot, "runs": runs}


def hardware_lines(
    base: str, snapshot: dict[str, Any], token: str | None, timeout: float
) -> list[str]:
    """The hottest, slowest and most loaded cards of the live runs (a server without
    telemetry, or before it, answers nothing for them: no lines)."""
    from rankwatch.aggregator.telemetry.cards import status_lines

    out: list[str] = []
    live = [r for r in snapshot.get("runs") or [] if not r.get("history")][:HARDWARE_RUNS]
    for entry in live:
        query = urllib.parse.urlencode({"run": entry.get("run")})
        try:
            hw = request_json(f"{base}/api/run/telemetry?{query}", token, timeout)
        except ApiError:
            continue
        if isinstance(hw, dict):
            lines = status_lines(hw)
            out += ([""] if out and lines else []) + lines
    return out


def print_commands(base: str, run: str, token: str | None, timeout: float) -> None:
    """The commands sent to ``run``'s ranks and their answers (nothing when none, or when the
    server is older than commands)."""
    from rankwatch.aggregator.actions.words import command_lines

    url = f"{base}/api/run/commands?{urllib.parse.urlencode({'run': run})}"
    try:
        answer = request_json(url, token, timeout)
    except ApiError:
        return
    commands = answer.get("commands") if isinstance(answer, dict) else None
    for line in command_lines(commands or []):
        print(line)


def compare(args: argparse.Namespace) -> int:
    from rankwatch.aggregator.alerts.console import render_compare

    if args.run is None:
        print("rankwatch status: --compare needs --run (the run to compare)", file=sys.stderr)
        return 2
    query = {"run": args.run, **({"ref": args.compare} if args.compare else {})}
    try:
        url = f"{server_url(args.url)}/api/run/compare?{urllib.parse.urlencode(query)}"
        answer = request_json(url, token_of(args), args.timeout)
    except ApiError as exc:
        print(f"rankwatch status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(answer, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    if answer.get("ref") is None:  # a job's first run: nothing to compare it with
        print(
            f"rankwatch status: run {args.run!r} has no earlier run of the same job to compare "
            "with (name one: --compare RUN)",
            file=sys.stderr,
        )
        return 2
    if not args.json:
        print(render_compare(answer))
    return 0


def no_such_run(name: str, runs: list[Any]) -> str:
    """What to say when ``--run name`` is none of ``runs``: the newest few it could have been."""
    entries = [r for r in runs if isinstance(r, dict) and isinstance(r.get("run"), str)]
    if not entries:
        return f"no run named {name!r}: the server has no runs yet"

    def newest(r: dict[str, Any]) -> float:
        t = r.get("last_time")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0

    entries.sort(key=newest, reverse=True)
    names = ", ".join(r["run"] for r in entries[:KNOWN_RUNS_SHOWN])
    more = len(entries) - KNOWN_RUNS_SHOWN
    tail = f" (and {more} more)" if more > 0 else ""
    return f"no run named {name!r}; the server knows (newest first): {names}{tail}"
