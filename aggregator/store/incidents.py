"""Incidents in the store: the latest judgement of each incident, so the page and
`rankwatch status` still show them after the run ends and after `serve` restarts.

One row per announced change (``id``, the time of the judgement, the incident as JSON); a read
keeps the newest row of each id. Written by the store's flush, like everything else. A run's
incidents are decoded once per flush that stored one of its judgements (``Memo``): a 100,000-rank
incident lists its affected ranks, and the page and `status` read them every few seconds."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
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


class Memo:
    """Each run's decoded incidents, kept until a flush stores another judgement of that run
    (``stored``). A read gets its own list of shallow copies: callers add keys, never change
    the nested values of a stored judgement."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: dict[str, int] = {}
        self._kept: dict[str, tuple[int, list[dict[str, Any]]]] = {}

    def stored(self, runs: Iterable[str]) -> None:
        """A flush has stored judgements of ``runs``: their next read decodes again."""
        with self._lock:
            for run in runs:
                self._version[run] = self._version.get(run, 0) + 1
                self._kept.pop(run, None)

    def read(self, run: str, fetch: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        with self._lock:
            version = self._version.get(run, 0)
            kept = self._kept.get(run)
        if kept is not None and kept[0] == version:
            body = kept[1]
        else:  # a flush between this version and the fetch only makes the next read decode
            body = fetch()
            with self._lock:
                if self._version.get(run, 0) == version:
                    self._kept[run] = (version, body)
        return [dict(inc) for inc in body]
