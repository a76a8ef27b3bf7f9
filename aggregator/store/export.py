"""Export one run's step history as long rows (run, rank, step, epoch, time, metric, value), and
its telemetry beside it (``telemetry_path``: run, rank, inc, time, source, device, name, value).

CSV writes non-finite values as ``nan``, ``inf`` and ``-inf`` and an unknown epoch as an empty
field; Parquet keeps them as IEEE doubles and nulls. DuckDB writes both (``COPY``), so a run of
any size streams to disk without passing through Python. ``lay_out_hive`` turns one Parquet
export into folders by run and rank.
"""

from __future__ import annotations

from pathlib import Path

from rankwatch.aggregator.store.db import Store

FORMATS = ("csv", "parquet")


class ExportError(ValueError):
    """The export cannot be done as asked (unknown run, format or target directory)."""


def export_run(store: Store, run: str, out_path: Path | str, fmt: str | None = None) -> int:
    """Write ``run`` to ``out_path`` as ``fmt`` ("csv" or "parquet"; default: from the file
    suffix). Returns the number of rows written."""
    out_path = Path(out_path)
    fmt = (fmt or out_path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    known = [r["run"] for r in store.runs()]
    if run not in known:
        listing = ", ".join(repr(k) for k in sorted(known)) if known else "none"
        raise ExportError(f"no run named {run!r} in {store.path}; known runs: {listing}")
    if not out_path.parent.is_dir():
        raise ExportError(f"cannot write {out_path}: {out_path.parent} is not a directory")
    return store.export_steps(run, out_path, fmt)


def lay_out_hive(parquet: Path | str, out_dir: Path | str) -> int:
    """Lay the long rows of an exported Parquet file (one run) out by run and rank in Hive-style
    folders, ``out_dir/run=<run>/rank=<k>/steps_<uuid>.parquet``, which DuckDB, Spark and
    ClickHouse read as one table with ``run`` and ``rank`` columns from the folder names. Other
    runs already in ``out_dir`` stay; a run already there is refused, so two exports of one
    run never count its rows twice. Returns the number of rows laid out."""
    import duckdb

    parquet, out_dir = Path(parquet), Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"cannot lay out a Hive tree in {out_dir}: it is a file")
    if not out_dir.parent.is_dir():
        raise ExportError(f"cannot write {out_dir}: {out_dir.parent} is not a directory")
    con = duckdb.connect()
    try:
        con.execute(f"CREATE VIEW source AS SELECT * FROM read_parquet('{_quoted(parquet)}')")
        runs = [r[0] for r in con.execute("SELECT DISTINCT run FROM source").fetchall()]
        if out_dir.is_dir() and any(out_dir.glob("run=*/rank=*/*.parquet")):
            held = con.execute(
                "SELECT DISTINCT run FROM read_parquet(?, hive_partitioning = true)",
                [str(out_dir / "**" / "*.parquet")],
            ).fetchall()
            again = sorted({r[0] for r in held} & set(runs))
            if again:
                raise ExportError(
                    f"{out_dir} already holds run {again[0]!r}: remove its run= folder or "
                    "choose another --out"
                )
        row = con.execute(
            f"COPY (SELECT * FROM source) TO '{_quoted(out_dir)}' "
            "(FORMAT PARQUET, PARTITION_BY (run, rank), APPEND, FILENAME_PATTERN 'steps_{uuid}')"
        ).fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def _quoted(path: Path) -> str:
    """``path`` inside a single-quoted SQL string literal."""
    return str(path).replace("'", "''")


def telemetry_path(out_path: Path | str) -> Path:
    """Where an export to ``out_path`` puts the telemetry: run.csv -> run.telemetry.csv."""
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}.telemetry{out_path.suffix}")


def export_telemetry(store: Store, run: str, out_path: Path | str, fmt: str | None = None) -> int:
    """Write ``run``'s telemetry to ``out_path`` (checked as ``export_run`` does); 0 rows and
    no file when the run has none."""
    out_path = Path(out_path)
    fmt = (fmt or out_path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    if run not in store.telemetry_runs():
        return 0
    if not out_path.parent.is_dir():
        raise ExportError(f"cannot write {out_path}: {out_path.parent} is not a directory")
    return store.export_telemetry(run, out_path, fmt)
