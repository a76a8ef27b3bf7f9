"""Opening the store's DuckDB file: the connection, the tables, upgrades of older stores, and
what went wrong when it cannot be opened (locked by another process, or not a readable store)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import duckdb
from rankwatch.aggregator.store import rollup
from rankwatch.aggregator.store.rows import ADD_INC, TABLES

STORE_FILENAME = "store.duckdb"  # inside the data dir when Store is given a directory
SCHEMA_VERSION = 2  # 2: the band's rollups in two rows per bucket
MEMORY_LIMIT = "512MB"  # DuckDB's buffer pool; keeps the aggregator well under 1 GB RSS

# What the person who started the aggregator can do about each reason
HINTS = {
    "locked": "is another `rankwatch serve` or `rankwatch import` using this data dir?",
    "corrupt": "the file is damaged or not a rankwatch store: move it aside (keep it for "
    "recovery) and start again; the agents' JSONL files can be loaded with `rankwatch import`",
}
_LOCK_MARKS = ("could not set lock", "conflicting lock")
_CORRUPT_MARKS = ("not a valid duckdb database", "corrupt", "checksum", "serializ")


class StoreError(RuntimeError):
    """The store cannot be opened or written (not writable, disk full, locked by another
    process, damaged). Unflushed records stay buffered in memory; nothing already stored is
    harmed. ``reason``: "locked", "corrupt" or "" (anything else); ``hint``: what to do."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def hint(self) -> str:
        return HINTS.get(self.reason, "")


def open_reason(exc: BaseException) -> str:
    """Why DuckDB refused to open or read a store file: "locked", "corrupt" or ""."""
    text = str(exc).lower()
    if any(mark in text for mark in _LOCK_MARKS):
        return "locked"
    corrupt_kinds = (duckdb.SerializationException, duckdb.InternalException)
    if isinstance(exc, corrupt_kinds) or any(mark in text for mark in _CORRUPT_MARKS):
        return "corrupt"
    return ""


def connect(path: Path, memory_limit: str) -> duckdb.DuckDBPyConnection:
    _warm_up_duckdb()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return duckdb.connect(str(path), config=_config(memory_limit))
    except (OSError, duckdb.Error) as exc:
        reason = open_reason(exc) if isinstance(exc, duckdb.Error) else ""
        raise StoreError(f"cannot open the store at {path}: {exc}", reason) from exc


def create(cur: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Create what is missing; upgrade a store an earlier version wrote."""
    for spec in TABLES:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {spec}")
    cur.execute(ADD_INC)
    rollup.create_tables(cur)
    row = cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        cur.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    elif int(row[0]) > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema {row[0]}, newer than {SCHEMA_VERSION}")
    elif int(row[0]) < SCHEMA_VERSION:
        _upgrade(cur, int(row[0]))


def _upgrade(cur: duckdb.DuckDBPyConnection, version: int) -> None:
    """Bring a store an earlier version wrote up to SCHEMA_VERSION, in one transaction."""
    script = ["BEGIN TRANSACTION"]
    if version < 2:
        # v2: the band's rollups keep two rows per bucket (rollup.band_part_sql), not one
        # per statistic; they are folded again from the band's rows
        script += [
            *(f"DELETE FROM {rollup.table('band', w, o)}" for w in rollup.LEVELS
              for o in (False, True)),
            "CREATE OR REPLACE TEMP TABLE rw_band AS SELECT * FROM band",
        ]  # fmt: skip
        part = rollup.band_part_sql("rw_band", rollup.LEVELS[0])
        script = rollup.fold(cur, "band", part, script)
    rollup.run_script(cur, [
        *script,
        f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'",
        "COMMIT",
    ])  # fmt: skip


def _config(memory_limit: str) -> dict[str, Any]:
    # Insertion order is not kept: every read that needs an order sorts (ORDER BY, or
    # rollup.sort_buckets), and without it DuckDB writes a flush's rows in parallel
    # (docs/benchmarks.md, bench/ingest.py).
    return {"memory_limit": memory_limit, "preserve_insertion_order": False}


_warmed = threading.Lock()
_warm = False


def _warm_up_duckdb() -> None:
    """Run DuckDB's first numpy fetch once, in one thread.

    DuckDB 2.0 can deadlock when two threads make a process's first ``fetchnumpy`` at the same
    time (it imports modules lazily then). Every store does this before its first query, so
    its reads are safe from any thread without a lock around them.
    """
    global _warm
    with _warmed:
        if not _warm:
            con = duckdb.connect()
            try:
                con.execute("SELECT 1::DOUBLE AS v").fetchnumpy()
                con.sql("SELECT 1::DOUBLE AS v").fetchnumpy()  # the read path's way
            finally:
                con.close()
            _warm = True
