"""Stack samples in the store: the latest of each rank (where its main thread was when it last
stalled, from its heartbeats or an imported ``rank<k>.stacks.txt``), so ``rankwatch stacks``
and the page still show them after the run ends and after `serve` restarts.

One row per (run, rank): a flush writes the newest sample of each rank it holds and deletes
that rank's older row, so the table stays as small as the ranks that ever stalled."""

from __future__ import annotations

import json
from typing import Any

import duckdb

TABLE = "stacks (run VARCHAR, rank BIGINT, time DOUBLE, body VARCHAR)"

Row = tuple[str, int, float, str]


def row(run: str, rank: int, sample: dict[str, Any]) -> Row:
    """``sample``: the wire form (``StackSample.as_dict()``)."""
    return (run, rank, float(sample.get("time", 0.0)), json.dumps(sample, allow_nan=False))


def insert(cur: duckdb.DuckDBPyConnection, rows: list[Row]) -> None:
    """Keep the newest of ``rows`` and of the stored row for each (run, rank), in one
    transaction."""
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute("CREATE OR REPLACE TEMP TABLE rw_stacks (run VARCHAR, rank BIGINT, "
                    "time DOUBLE, body VARCHAR)")  # fmt: skip
        cur.executemany("INSERT INTO rw_stacks VALUES (?, ?, ?, ?)", rows)
        cur.execute(
            "DELETE FROM stacks USING rw_stacks n WHERE stacks.run = n.run "
            "AND stacks.rank = n.rank AND stacks.time <= n.time"
        )
        cur.execute(
            "INSERT INTO stacks SELECT n.* FROM rw_stacks n WHERE NOT EXISTS (SELECT 1 FROM "
            "stacks s WHERE s.run = n.run AND s.rank = n.rank)"
        )
        cur.execute("DROP TABLE rw_stacks")
        cur.execute("COMMIT")
    except duckdb.Error:
        cur.execute("ROLLBACK")
        raise


def read(cur: duckdb.DuckDBPyConnection, run: str) -> dict[int, dict[str, Any]]:
    """Rank -> its latest stored sample (the wire form) for ``run``."""
    rows = cur.execute(
        "SELECT rank, arg_max(body, time) FROM stacks WHERE run = ? GROUP BY rank ORDER BY rank",
        [run],
    ).fetchall()
    return {int(rank): json.loads(body) for rank, body in rows}
