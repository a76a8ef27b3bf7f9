"""Incidents in the store: the latest judgement of each incident, so the page and
`rankwatch status` still show them after the run ends and after `serve` restarts.

One row per announced change (``id``, the time of the judgement, the incident as JSON); a read
keeps the newest row of each id. Written by the store's flush, like everything else."""

from __future__ import annotations

import json
from typing import Any

import duckdb

TABLE = "incidents (run VARCHAR, id VARCHAR, updated DOUBLE, body VARCHAR)"


def insert(cur: duckdb.DuckDBPyConnection, rows: list[tuple[str, str, float, str]]) -> None:
    cur.executemany("INSERT INTO incidents VALUES (?, ?, ?, ?)", rows)


def row(incident: dict[str, Any]) -> tuple[str, str, float, str]:
    return (incident["run"], incident["id"], float(incident["updated"]), json.dumps(incident))


def read(cur: duckdb.DuckDBPyConnection, run: str) -> list[dict[str, Any]]:
    """The latest judgement of every stored incident of ``run``, oldest first."""
    rows = cur.execute(
        "SELECT arg_max(body, updated) FROM incidents WHERE run = ? GROUP BY id "
        "ORDER BY min(updated), id",
        [run],
    ).fetchall()
    out = [json.loads(body) for (body,) in rows]
    return sorted(out, key=lambda inc: (inc.get("opened", 0.0), inc.get("id", "")))
