"""Commands in the store: every command the aggregator sent and each rank's answer, so the page,
the API and `rankwatch status` show them after the run ends and after `serve` restarts.

One row per change of a command (its id, the time of the change, the command as JSON,
``Issued.as_dict()``); a read keeps the newest row of each id. Written by the store's flush."""

from __future__ import annotations

import json
from typing import Any

import duckdb

TABLE = "commands (run VARCHAR, id VARCHAR, updated DOUBLE, body VARCHAR)"

Row = tuple[str, str, float, str]


def row(command: dict[str, Any]) -> Row:
    return (command["run"], command["id"], float(command["updated"]), json.dumps(command))


def insert(cur: duckdb.DuckDBPyConnection, rows: list[Row]) -> None:
    cur.executemany("INSERT INTO commands VALUES (?, ?, ?, ?)", rows)


def read(
    cur: duckdb.DuckDBPyConnection, run: str | None, since: float = 0.0
) -> list[dict[str, Any]]:
    """The latest state of every stored command of ``run`` (or of every run) changed at or
    after ``since``, oldest first."""
    where, args = ("WHERE run = ?", [run]) if run is not None else ("", [])
    rows = cur.execute(
        f"SELECT arg_max(body, updated) FROM commands {where} GROUP BY id "
        "HAVING max(updated) >= ? ORDER BY min(updated), id",
        [*args, since],
    ).fetchall()
    out = [json.loads(body) for (body,) in rows]
    return sorted(out, key=lambda c: (c.get("created", 0.0), c.get("id", "")))
