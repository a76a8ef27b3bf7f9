"""`rankwatch export`: one run's step history as long rows, CSV or Parquet, or Parquet laid out
in Hive-style folders by run and rank: through a running `rankwatch serve` (``--url``, which
holds the store's lock), or from a stopped one's store (``--data``)."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

NAME = "export"
HELP = "export a run's metrics (run, rank, step, epoch, time, metric, value) to CSV or Parquet"
FORMATS = ("csv", "parquet", "hive")
CHUNK_BYTES = 1 << 20
ROWS_HEADER = "X-Rankwatch-Rows"  # the server's count of the rows it wrote
TIMEOUT_S = 300.0  # the server writes the whole file before it answers


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from rankwatch.cli.status import TOKEN_ENV

    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    parser.add_argument("--run", required=True, help="the run to export")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="default: from the --out suffix; hive: Parquet files in a folder by run and rank "
        "(OUT/run=R/rank=K/*.parquet), which DuckDB, Spark and ClickHouse read as one table",
    )
    parser.add_argument(
        "--out", required=True, metavar="PATH", help="file to write (a folder for --format hive)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        help="a running `rankwatch serve` (http://HOST:PORT): export through it, as its store "
        "is locked while it runs",
    )
    where.add_argument(
        "--data",
        metavar="DIR",
        default="rankwatch_data",
        help="data directory of a stopped serve (./rankwatch_data; the demo's: "
        "rankwatch_data/demo)",
    )
    parser.add_argument("--token", help=f"API token, if the server wants one (or {TOKEN_ENV})")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    fmt = (args.format or out.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        return _fail(f"unknown export format {fmt!r}: use --format csv or parquet (or --out X.csv)")
    if not out.parent.is_dir():
        return _fail(f"cannot write {out}: {out.parent} is not a directory")
    if fmt == "hive":
        return _hive(args, out)
    return _export(args, out, fmt, print)


def _export(args: argparse.Namespace, out: Path, fmt: str, say: Callable[[str], None]) -> int:
    if args.url is not None:
        return _through_server(args, out, fmt, say)
    return _from_store(args, out, fmt, say)


def _hive(args: argparse.Namespace, out: Path) -> int:
    """One Parquet export (from the store or through the server), then laid out by rank."""
    if out.exists() and not out.is_dir():
        return _fail(f"--format hive writes a folder, and {out} is a file")
    from rankwatch.aggregator.store.export import telemetry_path

    staged = out.with_name(f".{out.name}.{os.getpid()}.parquet")
    try:
        # the steps only: telemetry has other columns (--format parquet writes it beside)
        code = _export(args, staged, "parquet", lambda _said: None)
        if code:
            return code
        from rankwatch.aggregator.store.export import ExportError, lay_out_hive

        try:
            rows = lay_out_hive(staged, out)
        except ExportError as exc:
            return _fail(str(exc))
    finally:
        staged.unlink(missing_ok=True)
        telemetry_path(staged).unlink(missing_ok=True)
    where = f" (through {args.url})" if args.url is not None else ""
    print(f"wrote {rows:,} rows of run {args.run!r} to {out}/run=.../rank=.../{where}")
    return 0


def _from_store(args: argparse.Namespace, out: Path, fmt: str, say: Callable[[str], None]) -> int:
    from rankwatch.aggregator.store.db import STORE_FILENAME, Store, StoreError
    from rankwatch.aggregator.store.export import (
        ExportError,
        export_run,
        export_telemetry,
        telemetry_path,
    )
    from rankwatch.cli.status import DEFAULT_URL

    data = Path(args.data)
    store_file = data if data.suffix in (".duckdb", ".db") else data / STORE_FILENAME
    if not store_file.exists():  # opening would create an empty store
        return _fail(f"no store at {store_file} (is --data the directory `rankwatch serve` used?)")
    try:
        with Store(data) as store:
            rows = export_run(store, args.run, out, fmt)
            tele = export_telemetry(store, args.run, telemetry_path(out), fmt)
    except ExportError as exc:
        return _fail(str(exc))
    except StoreError as exc:
        if exc.reason == "locked":
            return _fail(
                f"a serve is running on this store ({data}): use --url http://HOST:PORT "
                f"(the address it printed; by default {DEFAULT_URL})"
            )
        return _fail(str(exc))
    say(f"wrote {rows:,} rows of run {args.run!r} to {out}")
    if tele:
        say(f"wrote {tele:,} telemetry rows of run {args.run!r} to {telemetry_path(out)}")
    return 0


def _through_server(
    args: argparse.Namespace, out: Path, fmt: str, say: Callable[[str], None]
) -> int:
    from rankwatch.aggregator.store.export import telemetry_path

    code = _fetch(args, out, fmt, "steps", say)
    if code == 0:
        code = _fetch(args, telemetry_path(out), fmt, "telemetry", say, quiet_empty=True)
    return code


def _fetch(
    args: argparse.Namespace,
    out: Path,
    fmt: str,
    what: str,
    say: Callable[[str], None],
    quiet_empty: bool = False,
) -> int:
    from rankwatch.cli.status import TOKEN_ENV, ApiError, detail_of, server_url

    try:
        base = server_url(args.url)
    except ApiError as exc:
        return _fail(str(exc))
    query = urllib.parse.urlencode({"run": args.run, "format": fmt, "what": what})
    url = f"{base}/api/run/export?{query}"
    token = args.token or os.environ.get(TOKEN_ENV)
    headers = {"User-Agent": "rankwatch-cli"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    part = out.with_name(out.name + ".part")
    size = 0
    rows = "?"
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, part.open("wb") as f:
            rows = response.headers.get(ROWS_HEADER) or rows
            while chunk := response.read(CHUNK_BYTES):
                f.write(chunk)
                size += len(chunk)
        part.replace(out)
    except urllib.error.HTTPError as exc:
        detail = detail_of(exc)
        exc.close()
        part.unlink(missing_ok=True)
        if exc.code in (401, 403):
            hint = "a valid --token" if token else f"a token: pass --token or set {TOKEN_ENV}"
            return _fail(f"{base}: HTTP {exc.code}: the server wants {hint}")
        more = f" (`rankwatch status --url {base}` lists its runs)" if exc.code == 404 else ""
        return _fail(f"{base}: HTTP {exc.code}: {detail}{more}")
    except urllib.error.URLError as exc:
        part.unlink(missing_ok=True)
        return _fail(
            f"cannot reach rankwatch at {base}: {exc.reason} (is `rankwatch serve` running?)"
        )
    except OSError as exc:
        part.unlink(missing_ok=True)
        return _fail(f"{exc}")
    if quiet_empty and rows == "0":
        out.unlink(missing_ok=True)
        return 0
    count = f"{int(rows):,}" if rows.isdigit() else rows
    kind = "telemetry rows" if what == "telemetry" else "rows"
    say(f"wrote {count} {kind} of run {args.run!r} to {out} (through {base}, {size:,} bytes)")
    return 0


def _fail(message: str) -> int:
    print(f"rankwatch export: {message}", file=sys.stderr)
    return 2
