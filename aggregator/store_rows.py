"""The store's row layout and bookkeeping: table definitions, the write buffer (records ->
numpy columns), records rebuilt from rows, and the in-memory summaries (``Mirror``) that
runs(), query planning and the band frontier read. Only store.py uses it."""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
from rankwatch.agent.records import EventRecord, Heartbeat, Record, StepRecord
from rankwatch.aggregator import rollup

# Column kinds: "s" string, "i" int, "n" nullable int, "f" float, "b" bool.
# DuckDB reads numpy columns zero-copy but turns NaN into NULL and cannot type an int column
# holding None, so nullable ints travel as NULL_INT and floats get their NaN back in SQL.
NULL_INT = -(2**63)
_T = {"s": "VARCHAR", "i": "BIGINT", "n": "BIGINT", "f": "DOUBLE", "b": "BOOLEAN"}
LAYOUT: dict[str, tuple[tuple[str, str], ...]] = {
    "steps": (("run", "s"), ("rank", "i"), ("seq", "i"), ("step", "i"), ("epoch", "n"),
              ("time", "f"), ("metric", "s"), ("value", "f")),
    "events": (("run", "s"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("world_size", "i"),
               ("host", "s"), ("pid", "i"), ("event", "s"), ("step", "n"), ("info", "s")),
    "heartbeats": (("run", "s"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("last_step", "n"),
                   ("next_in", "f"), ("dropped", "i"), ("paused", "s")),
    # one row per buffered record of any kind: seq intervals, rank summaries, rank_meta
    "recs": (("run", "s"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("kind", "s"),
             ("world_size", "n"), ("host", "s"), ("pid", "n"), ("step", "n"), ("event", "s")),
    "ranks": (("run", "s"), ("rank", "i"), ("world_size", "n"), ("host", "s"), ("pid", "n"),
              ("first_time", "f"), ("last_time", "f"), ("records", "i"), ("last_step", "n"),
              ("meta_seq", "n"), ("life_seq", "n"), ("ended", "b")),
}  # fmt: skip
BUFFERED = ("steps", "events", "heartbeats", "recs")

TABLES = (
    *(
        f"{name} ({', '.join(f'{c} {_T[k]}' for c, k in LAYOUT[name])})"
        for name in ("steps", "events", "heartbeats", "ranks")
    ),
    "rank_meta (run VARCHAR, rank BIGINT, seq BIGINT, world_size BIGINT, host VARCHAR, "
    "pid BIGINT)",  # change log: a rank's world_size/host/pid from this seq on
    "seqs (run VARCHAR, rank BIGINT, lo BIGINT, hi BIGINT)",
    "band (run VARCHAR, metric VARCHAR, step BIGINT, n BIGINT, nonfinite BIGINT, "
    "median DOUBLE, p5 DOUBLE, p95 DOUBLE, vmin DOUBLE, vmax DOUBLE)",
    "band_done (run VARCHAR, done BIGINT)",  # last settled band step of a run
    "band_late (run VARCHAR, metric VARCHAR, step BIGINT)",  # earliest value after settling
    "meta (key VARCHAR, value VARCHAR)",
)


# --- the bookkeeping a flush does in SQL over its batch (temp table buf_recs) ----------

# Seen (run, rank, seq) as merged intervals, in two steps: this flush's seqs as intervals
# (a rank's seqs are usually one unbroken run: min/max/count, no sort; otherwise islands by
# seq - dense_rank), then gaps-and-islands over those plus the touched ranks' old intervals.
SEQ_BATCH = (
    """CREATE OR REPLACE TEMP TABLE rw_sg AS SELECT run, rank, min(seq) AS lo, max(seq) AS hi,
    count(DISTINCT seq) AS n FROM buf_recs GROUP BY run, rank""",
    """CREATE OR REPLACE TEMP TABLE rw_si AS
    SELECT run, rank, lo, hi FROM rw_sg WHERE hi - lo + 1 = n
    UNION ALL
    SELECT run, rank, min(seq), max(seq) FROM (
        SELECT r.run, r.rank, r.seq, r.seq - dense_rank() OVER (PARTITION BY r.run, r.rank
            ORDER BY r.seq) AS island
        FROM buf_recs r SEMI JOIN (SELECT run, rank FROM rw_sg WHERE hi - lo + 1 <> n) g
        ON r.run = g.run AND r.rank = g.rank)
    GROUP BY run, rank, island""",
)
SEQ_MERGE = """
CREATE OR REPLACE TEMP TABLE rw_seq AS
WITH u AS (SELECT * FROM rw_si
      UNION ALL SELECT s.run, s.rank, s.lo, s.hi FROM seqs s SEMI JOIN rw_sg k
      ON s.run = k.run AND s.rank = k.rank),
w AS (SELECT *, max(hi) OVER (PARTITION BY run, rank ORDER BY lo, hi
      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi FROM u),
g AS (SELECT *, sum(CASE WHEN prev_hi IS NULL OR lo > prev_hi + 1 THEN 1 ELSE 0 END)
      OVER (PARTITION BY run, rank ORDER BY lo, hi ROWS UNBOUNDED PRECEDING) AS island FROM w)
SELECT run, rank, min(lo) AS lo, max(hi) AS hi FROM g GROUP BY run, rank, island
"""

# Where a rank's world_size/host/pid start (its first record, a restart elsewhere): the first
# seq of each identity in this flush, in seq order (hash aggregate, no window over the batch).
META_BATCH = """
SELECT run, rank, min(seq) AS seq, world_size, host, pid FROM buf_recs
WHERE world_size IS NOT NULL GROUP BY run, rank, world_size, host, pid ORDER BY run, rank, seq
"""

RANK_BATCH = """
SELECT run, rank, count(*) AS records, min(time) AS first_time, max(time) AS last_time,
  max(step) FILTER (WHERE kind = 'step') AS last_step,
  arg_max(world_size, seq) FILTER (WHERE world_size IS NOT NULL) AS world_size,
  arg_max(host, seq) FILTER (WHERE world_size IS NOT NULL) AS host,
  arg_max(pid, seq) FILTER (WHERE world_size IS NOT NULL) AS pid,
  max(seq) FILTER (WHERE world_size IS NOT NULL) AS meta_seq,
  max(seq) FILTER (WHERE event IN ('start', 'end', 'crash')) AS life_seq,
  arg_max(event, seq) FILTER (WHERE event IN ('start', 'end', 'crash')) AS life
FROM buf_recs GROUP BY run, rank
"""


def columns(name: str, cols: Sequence[Sequence[Any]]) -> dict[str, np.ndarray]:
    """Python column lists -> numpy arrays DuckDB can scan (see NULL_INT)."""
    out: dict[str, np.ndarray] = {}
    for (col, kind), values in zip(LAYOUT[name], cols, strict=True):
        if kind == "n":
            values = [NULL_INT if v is None else v for v in values]
        dtype = {"s": object, "i": np.int64, "n": np.int64, "f": np.float64, "b": bool}[kind]
        out[col] = np.asarray(values, dtype=dtype)
    return out


def select_sql(name: str, src: str) -> str:
    """SELECT restoring NULLs and NaNs from numpy columns registered as ``src``."""
    exprs = []
    for col, kind in LAYOUT[name]:
        if kind == "n":
            exprs.append(f"CAST(nullif({col}, {NULL_INT}) AS BIGINT) AS {col}")
        elif kind == "f" and (name, col) == ("steps", "value"):
            exprs.append(
                "CASE WHEN metric IS NOT NULL THEN coalesce(value, 'nan'::DOUBLE) END AS value"
            )
        elif kind == "f":
            exprs.append(f"coalesce({col}, 'nan'::DOUBLE) AS {col}")
        else:
            exprs.append(f"CAST({col} AS {_T[kind]}) AS {col}")
    return f"SELECT {', '.join(exprs)} FROM {src}"


class Batch:
    """Records waiting for the next flush, plus whole numpy parts (bulk appends, or a batch
    handed back by a failed flush). Records are kept as they came (an append is a list
    extend) and turned into columns in bulk by the flush: ~2 µs less per record."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.parts: list[dict[str, dict[str, np.ndarray]]] = []

    @property
    def empty(self) -> bool:
        return not self.records and not self.parts

    def extend(self, records: Sequence[Record]) -> None:
        for rec in records:
            if not isinstance(rec, (StepRecord, EventRecord, Heartbeat)):
                raise TypeError(f"Store.append takes records, got {type(rec).__name__}")
        self.records.extend(records)

    def add_columns(
        self, run: str, metric: str, rank: np.ndarray, step: np.ndarray, value: np.ndarray,
        seq: np.ndarray, t: np.ndarray, world_size: int,
    ) -> None:  # fmt: skip
        n = len(step)
        runs, none = np.full(n, run, dtype=object), np.full(n, NULL_INT, dtype=np.int64)
        steps = (runs, rank, seq, step, none, t, np.full(n, metric, dtype=object), value)
        recs = (runs, rank, seq, t, np.full(n, "step", dtype=object),
                np.full(n, world_size, np.int64), np.full(n, "", dtype=object),
                np.zeros(n, np.int64), step, np.full(n, None, dtype=object))  # fmt: skip
        part = {name: columns(name, [[]] * len(LAYOUT[name])) for name in BUFFERED}
        part["steps"] = {c: np.asarray(v) for (c, _), v in zip(LAYOUT["steps"], steps, strict=True)}
        part["recs"] = {c: np.asarray(v) for (c, _), v in zip(LAYOUT["recs"], recs, strict=True)}
        self.parts.append(part)

    def as_parts(self) -> list[dict[str, dict[str, np.ndarray]]]:
        if not self.records:
            return list(self.parts)
        return [*self.parts, record_part(self.records)]

    def to_numpy(self) -> dict[str, dict[str, np.ndarray]]:
        parts = self.as_parts() or [{n: columns(n, [[]] * len(LAYOUT[n])) for n in BUFFERED}]
        if len(parts) == 1:
            return parts[0]
        return {
            name: {c: np.concatenate([p[name][c] for p in parts]) for c, _ in LAYOUT[name]}
            for name in BUFFERED
        }

    def split(self) -> tuple[Batch, Batch] | None:
        """Two batches holding this one's content, oldest first; None if it is one piece."""
        first, second = Batch(), Batch()
        if len(self.records) >= 2:
            half = len(self.records) // 2
            first.parts, first.records = self.parts, self.records[:half]
            second.records = self.records[half:]
        elif len(self.parts) >= 2 and not self.records:
            half = len(self.parts) // 2
            first.parts, second.parts = self.parts[:half], self.parts[half:]
        else:
            return None
        return first, second

    def absorb(self, newer: Batch, cap_rows: float) -> int:
        """Take ``newer``'s content after ours, then drop the oldest beyond ``cap_rows`` rows:
        whole parts first, then whole records (never half of either, so seq intervals and rows
        stay consistent; the newest piece always stays). Returns the rows dropped."""
        self.parts += newer.parts
        self.records += newer.records
        rows = sum(map(_part_rows, self.parts)) + sum(map(_record_rows, self.records))
        dropped = 0
        while rows > cap_rows and self.parts and (len(self.parts) > 1 or self.records):
            size = _part_rows(self.parts.pop(0))
            rows, dropped = rows - size, dropped + size
        gone = 0
        while rows > cap_rows and gone < len(self.records) - 1:
            size = _record_rows(self.records[gone])
            rows, dropped, gone = rows - size, dropped + size, gone + 1
        del self.records[:gone]
        return dropped


def _part_rows(part: dict[str, dict[str, np.ndarray]]) -> int:
    return sum(len(cols["seq"]) for cols in part.values())


def _record_rows(rec: Record) -> int:
    """Buffered rows of one record: its ``recs`` row plus its table's rows."""
    return 1 + max(1, len(rec.metrics)) if type(rec) is StepRecord else 2


_NO_METRICS = {None: None}  # a step record without metrics still gets a row, so it is stored


def record_part(records: Sequence[Record]) -> dict[str, dict[str, np.ndarray]]:
    """Records -> numpy columns per buffered table, column by column (step records, the bulk,
    without a Python call per record; events and heartbeats row by row)."""
    steps = [r for r in records if type(r) is StepRecord]
    others = [r for r in records if type(r) is not StepRecord] if len(steps) < len(records) else []
    cols = {name: [[] for _ in LAYOUT[name]] for name in BUFFERED}
    for rec in others:
        _add_row(cols, rec)
    part = {name: columns(name, c) for name, c in cols.items()}
    if steps:
        part["recs"] = _concat(part["recs"], _step_recs(steps))
        part["steps"] = _concat(part["steps"], _step_rows(steps))
    return part


def _step_recs(steps: list[StepRecord]) -> dict[str, np.ndarray]:
    n = len(steps)
    return columns(
        "recs",
        [
            [r.run for r in steps], [r.rank for r in steps], [r.seq for r in steps],
            [r.time for r in steps], ["step"] * n, [r.world_size for r in steps],
            [r.host for r in steps], [r.pid for r in steps], [r.step for r in steps], [None] * n,
        ],
    )  # fmt: skip


def _step_rows(steps: list[StepRecord]) -> dict[str, np.ndarray]:
    """One row per (record, metric)."""
    per = [r.metrics or _NO_METRICS for r in steps]
    counts = np.fromiter(map(len, per), np.int64, len(per))
    head = columns(
        "steps",
        [
            [r.run for r in steps], [r.rank for r in steps], [r.seq for r in steps],
            [r.step for r in steps], [r.epoch for r in steps], [r.time for r in steps], [], [],
        ],
    )  # fmt: skip
    # one repeat count for all when every record has as many metrics (the usual case)
    reps: int | np.ndarray = int(counts[0]) if (counts == counts[0]).all() else counts
    out = {c: np.repeat(head[c], reps) for c, _ in LAYOUT["steps"][:6]}
    out["metric"] = np.array([k for m in per for k in m], dtype=object)
    out["value"] = np.array([v for m in per for v in m.values()], dtype=np.float64)
    return out


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not len(a["seq"]):
        return b
    return {c: np.concatenate([a[c], b[c]]) for c in a}


def _add_row(c: dict[str, list[list]], rec: Record) -> None:
    head = (rec.run, rec.rank, rec.seq, rec.time)
    if isinstance(rec, EventRecord):
        ident = (rec.world_size, rec.host, rec.pid)
        _push(c["recs"], (*head, "event", *ident, None, rec.event))
        info = json.dumps(dict(rec.info), default=str)
        _push(c["events"], (*head, *ident, rec.event, rec.step, info))
    elif isinstance(rec, Heartbeat):
        _push(c["recs"], (*head, "heartbeat", None, None, None, None, None))
        _push(c["heartbeats"], (*head, rec.last_step, rec.next_in, rec.dropped, rec.paused))
    else:  # a StepRecord subclass
        _push(c["recs"], (*head, "step", rec.world_size, rec.host, rec.pid, rec.step, None))
        for name, value in (rec.metrics or _NO_METRICS).items():
            _push(c["steps"], (*head[:3], rec.step, rec.epoch, rec.time, name, value))


def _push(cols: list[list], values: tuple) -> None:
    for col, value in zip(cols, values, strict=True):
        col.append(value)


def read_records(con: duckdb.DuckDBPyConnection, run: str) -> Iterator[Record]:
    cur = con.cursor()
    try:
        events = [
            EventRecord(run, *row[:-1], info=json.loads(row[-1]))  # type: ignore[arg-type]
            for row in cur.execute(
                "SELECT rank, seq, time, world_size, host, pid, event, step, info FROM events "
                "WHERE run = ? ORDER BY rank, seq",
                [run],
            ).fetchall()
        ]
        beats = [
            Heartbeat(run, *row)
            for row in cur.execute(
                "SELECT rank, seq, time, last_step, next_in, dropped, paused FROM heartbeats "
                "WHERE run = ? ORDER BY rank, seq",
                [run],
            ).fetchall()
        ]
        yield from heapq.merge(
            _step_records(cur, run), events, beats, key=lambda r: (r.rank, r.seq)
        )
    finally:
        cur.close()


def _step_records(cur: duckdb.DuckDBPyConnection, run: str) -> Iterator[StepRecord]:
    # world_size/host/pid of a step record: the latest rank_meta entry at or before its seq
    cur.execute(
        "SELECT s.rank, s.seq, s.time, m.world_size, m.host, m.pid, s.step, s.epoch, s.metric, "
        "s.value FROM steps s ASOF LEFT JOIN rank_meta m "
        "ON s.run = m.run AND s.rank = m.rank AND s.seq >= m.seq "
        "WHERE s.run = ? ORDER BY s.rank, s.seq",
        [run],
    )
    head: tuple | None = None
    metrics: dict[str, float] = {}
    while rows := cur.fetchmany(10_000):
        for row in rows:
            if head is not None and (row[0], row[1]) != (head[0], head[1]):
                yield _step_record(run, head, metrics)
                metrics = {}
            head = row
            if row[8] is not None:
                metrics[row[8]] = row[9]
    if head is not None:
        yield _step_record(run, head, metrics)


def _step_record(run: str, row: tuple, metrics: dict[str, float]) -> StepRecord:
    rank, seq, t, ws, host, pid, step, epoch = row[:8]
    return StepRecord(run, rank, seq, t, ws or 1, host or "", pid or 0, step, epoch, metrics)


# --- in-memory summaries: what runs(), metrics(), query planning and the band frontier read ---


@dataclass(frozen=True, slots=True)
class RankRow:
    """One row of the ``ranks`` table: a rank's summary, rewritten at each flush touching it."""

    run: str
    rank: int
    world_size: int | None
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    records: int
    last_step: int | None
    meta_seq: int | None  # seq of the record world_size/host/pid come from
    life_seq: int | None  # seq of the latest start/end/crash event
    ended: bool

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in RANK_FIELDS}


RANK_FIELDS = tuple(RankRow.__dataclass_fields__)


def ranks_columns(rows: Sequence[RankRow]) -> dict[str, np.ndarray]:
    return columns("ranks", [[getattr(r, f) for r in rows] for f in RANK_FIELDS])


@dataclass(frozen=True, slots=True)
class MetricStats:
    """Rows, step span and ranks of one (run, metric): enough to pick a level without a query."""

    metric: str
    rows: int
    lo: int
    hi: int
    keys: frozenset[int]


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class Mirror:
    """Summaries kept in memory and rewritten to their tables inside each flush; copied before
    a flush and swapped in after its commit, so a failed flush leaves them untouched."""

    ranks: dict[str, dict[int, RankRow]] = field(default_factory=dict)  # run -> rank -> row
    stats: dict[tuple[str, str], MetricStats] = field(default_factory=dict)
    band: dict[str, int] = field(default_factory=dict)  # run -> last settled band step
    late: dict[tuple[str, str], int] = field(default_factory=dict)  # earliest step to repair

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection) -> Mirror:
        m = cls()
        for row in cur.execute(f"SELECT {', '.join(RANK_FIELDS)} FROM ranks").fetchall():
            m.ranks.setdefault(row[0], {})[row[1]] = RankRow(*row)
        m.band = dict(cur.execute("SELECT run, done FROM band_done").fetchall())
        for run, metric, step in cur.execute("SELECT * FROM band_late").fetchall():
            m.late[(run, metric)] = step
        # The coarsest level plus every open bucket covers each stored value exactly once.
        union = " UNION ALL ".join(
            f"SELECT run, metric, key, n, lo, hi FROM {t}"
            for t in [rollup.table("series", rollup.LEVELS[-1])]
            + [rollup.table("series", w, True) for w in rollup.LEVELS]
        )
        m.merge_metrics(
            cur.execute(
                f"SELECT run, metric, sum(n), min(lo), max(hi), list(DISTINCT key) FROM ({union}) "
                "GROUP BY run, metric"
            ).fetchall()
        )
        return m

    def copy(self) -> Mirror:
        """Shallow: merge_ranks replaces the per-run dicts it changes instead of mutating."""
        return Mirror(dict(self.ranks), dict(self.stats), dict(self.band), dict(self.late))

    def identity(self, run: str, rank: int) -> tuple[Any, Any, Any] | None:
        row = self.ranks.get(run, {}).get(rank)
        return None if row is None else (row.world_size, row.host, row.pid)

    def merge_ranks(self, rows: list[tuple]) -> list[RankRow]:
        """Fold a flush's per-rank aggregates (RANK_BATCH) in; returns the new rows."""
        changed = []
        for run in {row[0] for row in rows}:
            self.ranks[run] = dict(self.ranks.get(run, {}))
        for run, rank, n, t0, t1, last_step, ws, host, pid, meta_seq, life_seq, life in rows:
            old = self.ranks[run].get(rank)
            new_meta = meta_seq is not None and (
                old is None or old.meta_seq is None or meta_seq > old.meta_seq
            )
            new_life = life_seq is not None and (
                old is None or old.life_seq is None or life_seq > old.life_seq
            )
            row = RankRow(
                run=run,
                rank=rank,
                world_size=ws if new_meta or old is None else old.world_size,
                host=host if new_meta or old is None else old.host,
                pid=pid if new_meta or old is None else old.pid,
                first_time=t0 if old is None else min(old.first_time, t0),
                last_time=t1 if old is None else max(old.last_time, t1),
                records=n + (0 if old is None else old.records),
                last_step=_max(None if old is None else old.last_step, last_step),
                meta_seq=meta_seq if new_meta or old is None else old.meta_seq,
                life_seq=life_seq if new_life or old is None else old.life_seq,
                ended=(life in ("end", "crash")) if new_life else bool(old and old.ended),
            )
            self.ranks[run][rank] = row
            changed.append(row)
        return changed

    def merge_metrics(self, rows: list[tuple]) -> None:
        for run, metric, n, lo, hi, keys in rows:
            old = self.stats.get((run, metric))
            if old is not None:
                n, lo, hi = n + old.rows, min(lo, old.lo), max(hi, old.hi)
                keys = old.keys | set(keys)
            self.stats[(run, metric)] = MetricStats(metric, int(n), lo, hi, frozenset(keys))

    def last_step(self, run: str) -> int | None:
        steps = [r.last_step for r in self.ranks.get(run, {}).values() if r.last_step is not None]
        return max(steps, default=None)

    def metric_stats(self, run: str) -> list[MetricStats]:
        return [s for (r, _), s in self.stats.items() if r == run]

    def runs(self) -> list[dict[str, Any]]:
        by_run = {run: list(rows.values()) for run, rows in self.ranks.items() if rows}
        return [
            {
                "run": run,
                "world_size": max((r.world_size or 0 for r in rows), default=0) or None,
                "ranks": len(rows),
                "first_time": min(r.first_time for r in rows),
                "last_time": max(r.last_time for r in rows),
                "records": sum(r.records for r in rows),
                "last_step": max(
                    (r.last_step for r in rows if r.last_step is not None), default=None
                ),
            }
            for run, rows in sorted(by_run.items(), key=lambda kv: min(r.first_time for r in kv[1]))
        ]

    def frontier(
        self,
        run: str,
        arrival: dict[int, float],
        now: float,
        first: float | None,
        stale_s: float,
        wait_unseen_s: float,
    ) -> int | None:
        """The last step whose band can be settled: one below the slowest live rank's latest
        step. Ranks that ended, crashed or went silent for ``stale_s`` do not hold it back;
        ranks of world_size never seen do, for ``wait_unseen_s`` after the run's first record.
        With no live rank left, everything is settled. None: nothing to settle yet."""
        rows = list(self.ranks.get(run, {}).values())
        world = max((r.world_size or 0 for r in rows), default=0)
        if world > len(rows) and first is not None and now - first < wait_unseen_s:
            return None
        live = [
            r.last_step
            for r in rows
            if r.last_step is not None
            and not r.ended
            and now - arrival.get(r.rank, -math.inf) < stale_s
        ]
        if live:
            return min(live) - 1
        return max((r.last_step for r in rows if r.last_step is not None), default=None)
