"""`rankwatch export`: one run's step history as long rows, CSV or Parquet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "export"
HELP = "export a run's metrics (run, rank, step, epoch, time, metric, value) to CSV or Parquet"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    parser.add_argument("--run", required=True, help="the run to export")
    parser.add_argument(
        "--format", choices=("csv", "parquet"), help="default: from the --out suffix"
    )
    parser.add_argument("--out", required=True, metavar="PATH", help="file to write")
    parser.add_argument(
        "--data", metavar="DIR", default="rankwatch_data", help="data directory (./rankwatch_data)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from rankwatch.aggregator.store.db import STORE_FILENAME, Store, StoreError
    from rankwatch.aggregator.store.export import ExportError, export_run

    data = Path(args.data)
    store_file = data if data.suffix in (".duckdb", ".db") else data / STORE_FILENAME
    if not store_file.exists():  # opening would create an empty store
        return _fail(f"no store at {store_file} (is --data the directory `rankwatch serve` used?)")
    try:
        with Store(data) as store:
            rows = export_run(store, args.run, args.out, args.format)
    except ExportError as exc:
        return _fail(str(exc))
    except StoreError as exc:
        return _fail(f"{exc}\n(stop the `rankwatch serve` using {data} first, or export a copy)")
    print(f"wrote {rows} rows of run {args.run!r} to {args.out}")
    return 0


def _fail(message: str) -> int:
    print(f"rankwatch export: {message}", file=sys.stderr)
    return 2
