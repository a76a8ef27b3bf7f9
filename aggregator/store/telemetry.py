"""Telemetry in the store: hardware samples beside the step series, indexed by time.

Rows come from the flush's buffer like every other record's (``parts.py``: a telemetry
record is one ``recs`` row, so its seq is stored and deduped like the others, one
``telemetry`` row per value and one ``telemetry_labels`` row per label). Labels are kept where
they change only: this flush's labels are compared with the latest stored per (run, rank,
source, device, name) in SQL (``telemetry_labels_last``, one row per key).

Long windows read rollups: per level width (seconds) closed buckets of ``(run, name, rank)``
with the count, sum, minimum and maximum and the times they occurred, so a spike survives
downsampling. A run's buckets roll up to ``telemetry_done`` (per run and width) once its newest
sample is ``ROLL_LAG_S`` past them; samples older than that arriving later (an import, a
resend) add partial rows to their bucket, read summed. Everything happens in the flush's
transaction. See docs/telemetry.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb

LEVELS: tuple[int, ...] = (60, 900)  # bucket widths in seconds
ROLL_LAG_S = 120.0  # a bucket rolls up once the run's newest sample is this far past it

_ROLLUP = ("run VARCHAR, name VARCHAR, rank BIGINT, b BIGINT, n BIGINT, s DOUBLE, mn DOUBLE, "
           "t_mn DOUBLE, mx DOUBLE, t_mx DOUBLE, t_lo DOUBLE, t_hi DOUBLE")  # fmt: skip
TABLES = (
    *(f"telemetry_l{w} ({_ROLLUP})" for w in LEVELS),
    "telemetry_done (run VARCHAR, width BIGINT, done DOUBLE)",
    "telemetry_labels_last (run VARCHAR, rank BIGINT, source VARCHAR, device VARCHAR, "
    "name VARCHAR, value VARCHAR)",
)


def _agg(width: int) -> str:
    return (
        f"run, name, rank, CAST(floor(time / {width}) AS BIGINT) AS b, count(*) AS n, "
        "sum(value) AS s, min(value) AS mn, arg_min(time, value) AS t_mn, max(value) AS mx, "
        "arg_max(time, value) AS t_mx, min(time) AS t_lo, max(time) AS t_hi"
    )


@dataclass(frozen=True)
class TeleRun:
    """Rows, time span, names and ranks of one run's telemetry: enough to plan a read."""

    rows: int
    lo: float
    hi: float
    names: frozenset[str]
    ranks: frozenset[int]

    def merged(self, other: TeleRun) -> TeleRun:
        return TeleRun(self.rows + other.rows, min(self.lo, other.lo), max(self.hi, other.hi),
                       self.names | other.names, self.ranks | other.ranks)  # fmt: skip

    def interval(self) -> float:
        """The typical seconds between two samples of one rank and name."""
        per_key = self.rows / max(1, len(self.names) * len(self.ranks))
        return (self.hi - self.lo) / max(1.0, per_key - 1) if per_key > 1 else 10.0


_STATS = ("SELECT run, count(*), min(time), max(time), list(DISTINCT name), list(DISTINCT rank) "
          "FROM {src} GROUP BY run")  # fmt: skip


def load(cur: duckdb.DuckDBPyConnection) -> tuple[dict[str, TeleRun], dict[tuple[str, int], float]]:
    """The runs' telemetry summaries and rollup frontiers, at open: from the coarsest rollup and
    the raw rows after its frontier (each run's), so opening does not scan a long history."""
    done = {(r, int(w)): d for r, w, d in cur.execute("SELECT * FROM telemetry_done").fetchall()}
    coarse = LEVELS[-1]
    rolled = cur.execute(
        f"SELECT run, sum(n), min(t_lo), max(t_hi), list(DISTINCT name), list(DISTINCT rank) "
        f"FROM telemetry_l{coarse} GROUP BY run"
    ).fetchall()
    runs = {row[0]: _run(row) for row in rolled}
    edges = {run: d for (run, w), d in done.items() if w == coarse}
    for run, edge in edges.items():  # one query a run: its tail is found by its row groups' times
        tail = cur.execute(
            "SELECT run, count(*), min(time), max(time), list(DISTINCT name), "
            "list(DISTINCT rank) FROM telemetry WHERE run = ? AND time >= ? GROUP BY run",
            [run, edge],
        ).fetchall()
        for row in tail:
            runs[run] = _run(row) if run not in runs else runs[run].merged(_run(row))
    unrolled = cur.execute(  # a run without a frontier (none after its first flush): all raw
        _STATS.format(src="telemetry WHERE run NOT IN (SELECT run FROM telemetry_done)")
    ).fetchall()
    for row in unrolled:
        runs[row[0]] = _run(row)
    return runs, done


def _run(row: tuple) -> TeleRun:
    _, n, lo, hi, names, ranks = row
    return TeleRun(int(n), float(lo), float(hi), frozenset(names), frozenset(map(int, ranks)))


def write(
    cur: duckdb.DuckDBPyConnection,
    runs: dict[str, TeleRun],
    done: dict[tuple[str, int], float],
    labels: bool,
) -> None:
    """Inside the flush's transaction, with this flush's rows in the temp tables ``buf_tel``
    (and ``buf_tlab`` when ``labels``): store them, keep the label changes, roll up the
    buckets that closed. ``runs`` and ``done`` (the flush's copies) are updated."""
    cur.execute("INSERT INTO telemetry SELECT * FROM buf_tel")
    if labels:
        _labels(cur)
    batch = {row[0]: _run(row) for row in cur.execute(_STATS.format(src="buf_tel")).fetchall()}
    for run, part in batch.items():
        old = runs.get(run)
        runs[run] = part if old is None else old.merged(part)
        for width in LEVELS:
            _roll(cur, run, width, runs[run], done)


def _labels(cur: duckdb.DuckDBPyConnection) -> None:
    key = "run, rank, source, device, name"
    on = " AND ".join(f"b.{k} = l.{k}" for k in key.split(", "))
    cur.execute(
        "INSERT INTO telemetry_labels SELECT b.run, b.rank, b.seq, b.time, b.source, b.device, "
        "b.name, b.value, b.inc FROM (SELECT *, lag(value) OVER (PARTITION BY "
        f"{key} ORDER BY time, seq) AS prev FROM buf_tlab) b LEFT JOIN telemetry_labels_last l "
        f"ON {on} WHERE (b.prev IS NULL AND l.value IS DISTINCT FROM b.value) "
        "OR b.prev <> b.value"
    )
    cur.execute(
        f"CREATE OR REPLACE TEMP TABLE rw_tlast AS SELECT {key}, arg_max(value, time) AS value "
        f"FROM buf_tlab GROUP BY {key}"
    )
    cur.execute(f"DELETE FROM telemetry_labels_last l USING rw_tlast b WHERE {on}")
    cur.execute("INSERT INTO telemetry_labels_last SELECT * FROM rw_tlast")


def _roll(
    cur: duckdb.DuckDBPyConnection,
    run: str,
    width: int,
    stats: TeleRun,
    done: dict[tuple[str, int], float],
) -> None:
    table = f"telemetry_l{width}"
    held = done.get((run, width))
    start = math.floor(stats.lo / width) * width if held is None else held
    if held is not None:  # samples for buckets already rolled up: partial rows of their own
        cur.execute(
            f"INSERT INTO {table} SELECT {_agg(width)} FROM buf_tel WHERE run = ? AND time < ? "
            "GROUP BY ALL",
            [run, held],
        )
    upto = math.floor((stats.hi - ROLL_LAG_S) / width) * width
    if upto <= start:
        if held is None:
            done[(run, width)] = start
            cur.execute("INSERT INTO telemetry_done VALUES (?, ?, ?)", [run, width, start])
        return
    cur.execute(
        f"INSERT INTO {table} SELECT {_agg(width)} FROM telemetry WHERE run = ? AND time >= ? "
        "AND time < ? GROUP BY ALL",
        [run, start, upto],
    )
    done[(run, width)] = upto
    cur.execute("DELETE FROM telemetry_done WHERE run = ? AND width = ?", [run, width])
    cur.execute("INSERT INTO telemetry_done VALUES (?, ?, ?)", [run, width, upto])
