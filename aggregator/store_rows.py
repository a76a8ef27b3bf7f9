"""The store's row layout and bookkeeping: table definitions, the write buffer (records ->
numpy columns), records rebuilt from rows, and the in-memory summaries (``Mirror``) that
runs(), query planning and the band frontier read. Only store.py uses it."""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

import duckdb
import numpy as np
from rankwatch.agent.records import EventRecord, Heartbeat, Record, StepBlock, StepRecord
from rankwatch.aggregator import rollup

# Column kinds: "c" a repeated string (run, metric, host...) as an int32 code into the part's
# name table (NULL_CODE: NULL), "s" free text as Python objects (event info), "i" int,
# "n" nullable int, "f" float, "b" bool. DuckDB reads numpy columns zero-copy but turns NaN into
# NULL and cannot type an int column holding None, so nullable ints travel as NULL_INT and
# floats get their NaN back in SQL. An object column it reads one Python string at a time,
# taking the GIL for each chunk and handing it back: with the ingest thread busy each hand-over
# waits for a switch interval (measured: 0.95 s instead of 25 ms for 400,000 rows), hence codes.
NULL_INT = -(2**63)
NULL_CODE = -1
_T = {"c": "VARCHAR", "s": "VARCHAR", "i": "BIGINT", "n": "BIGINT", "f": "DOUBLE", "b": "BOOLEAN"}
_DTYPE: dict[str, Any] = {
    "c": np.int32, "s": object, "i": np.int64, "n": np.int64, "f": np.float64, "b": bool,
}  # fmt: skip
LAYOUT: dict[str, tuple[tuple[str, str], ...]] = {
    "steps": (("run", "c"), ("rank", "i"), ("seq", "i"), ("step", "i"), ("epoch", "n"),
              ("time", "f"), ("metric", "c"), ("value", "f")),
    "events": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("world_size", "i"),
               ("host", "c"), ("pid", "i"), ("event", "c"), ("step", "n"), ("info", "s")),
    "heartbeats": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("last_step", "n"),
                   ("next_in", "f"), ("dropped", "i"), ("paused", "c")),
    # one row per buffered record of any kind: seq intervals, rank summaries, rank_meta
    "recs": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("kind", "c"),
             ("world_size", "n"), ("host", "c"), ("pid", "n"), ("step", "n"), ("event", "c")),
    "ranks": (("run", "c"), ("rank", "i"), ("world_size", "n"), ("host", "c"), ("pid", "n"),
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

# Seen (run, rank, seq) as merged intervals, in one statement: this flush's seqs as intervals
# (a rank's seqs are usually one unbroken run: min/max/count, no sort; otherwise islands by
# seq - dense_rank), then gaps-and-islands over those plus the touched ranks' old intervals.
SEQ_MERGE = """
CREATE OR REPLACE TEMP TABLE rw_seq AS
WITH sg AS MATERIALIZED (SELECT run, rank, min(seq) AS lo, max(seq) AS hi,
    count(DISTINCT seq) AS n FROM buf_recs GROUP BY run, rank),
si AS (SELECT run, rank, lo, hi FROM sg WHERE hi - lo + 1 = n
    UNION ALL
    SELECT run, rank, min(seq), max(seq) FROM (
        SELECT r.run, r.rank, r.seq, r.seq - dense_rank() OVER (PARTITION BY r.run, r.rank
            ORDER BY r.seq) AS island
        FROM buf_recs r SEMI JOIN (SELECT run, rank FROM sg WHERE hi - lo + 1 <> n) g
        ON r.run = g.run AND r.rank = g.rank)
    GROUP BY run, rank, island),
u AS (SELECT * FROM si
      UNION ALL SELECT s.run, s.rank, s.lo, s.hi FROM seqs s SEMI JOIN sg k
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


def columns(
    name: str, cols: Sequence[Sequence[Any]], names: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Python column lists -> numpy arrays DuckDB can scan (see NULL_INT); strings of "c"
    columns get their code in ``names`` (added when new)."""
    out: dict[str, np.ndarray] = {}
    for (col, kind), values in zip(LAYOUT[name], cols, strict=True):
        if kind == "n":
            values = [NULL_INT if v is None else v for v in values]
        elif kind == "c":
            values = _codes(list(values), {} if names is None else names)
        out[col] = np.asarray(values, dtype=_DTYPE[kind])
    return out


def _code(value: str | None, names: dict[str, int]) -> int:
    return NULL_CODE if value is None else names.setdefault(value, len(names))


def _codes(values: list[Any], names: dict[str, int]) -> np.ndarray:
    """Codes of a column of names: one hash per value, no Python call per value."""
    uniq = set(values)
    if len(uniq) == 1:
        return np.full(len(values), _code(next(iter(uniq)), names), np.int32)
    lookup = {v: _code(v, names) for v in uniq}
    return np.fromiter(map(lookup.__getitem__, values), np.int32, len(values))


def _nullable(values: list[int | None]) -> np.ndarray:
    nulls = values.count(None)
    if nulls == len(values):
        return np.full(len(values), NULL_INT, np.int64)
    if nulls:
        values = [NULL_INT if v is None else v for v in values]
    return np.array(values, dtype=np.int64)


def select_sql(name: str, src: str, names: str = "raw_names") -> str:
    """SELECT restoring strings, NULLs and NaNs from numpy columns registered as ``src``;
    codes index the column ``name`` of ``names`` (registered too, ordered by ``i``)."""
    exprs = []
    for col, kind in LAYOUT[name]:
        if kind == "c":
            exprs.append(f"nm.names[{col} + 1] AS {col}")
        elif kind == "n":
            exprs.append(f"CAST(nullif({col}, {NULL_INT}) AS BIGINT) AS {col}")
        elif kind == "f" and (name, col) == ("steps", "value"):
            exprs.append(
                f"CASE WHEN metric <> {NULL_CODE} THEN coalesce(value, 'nan'::DOUBLE) END AS value"
            )
        elif kind == "f":
            exprs.append(f"coalesce({col}, 'nan'::DOUBLE) AS {col}")
        else:
            exprs.append(f"CAST({col} AS {_T[kind]}) AS {col}")
    return (
        f"SELECT {', '.join(exprs)} FROM {src} CROSS JOIN "
        f"(SELECT list(CAST(name AS VARCHAR) ORDER BY i) AS names FROM {names}) nm"
    )


@dataclass
class Part:
    """Buffered rows as numpy columns per table (LAYOUT), "c" columns coded into ``names``."""

    tables: dict[str, dict[str, np.ndarray]]
    names: list[str]

    @property
    def rows(self) -> int:
        return sum(len(cols["seq"]) for cols in self.tables.values())

    @classmethod
    def empty(cls) -> Part:
        return cls({n: columns(n, [[]] * len(LAYOUT[n])) for n in BUFFERED}, [])

    @classmethod
    def merge(cls, parts: Sequence[Part]) -> Part:
        """One part holding all of ``parts`` in order (codes renumbered into one table)."""
        if len(parts) == 1:
            return parts[0]
        index: dict[str, int] = {}
        remaps = [
            np.array([*(index.setdefault(s, len(index)) for s in p.names), NULL_CODE], np.int32)
            for p in parts
        ]  # remap[-1] keeps NULL_CODE
        tables = {
            name: {
                col: np.concatenate(
                    [
                        remap[p.tables[name][col]] if kind == "c" else p.tables[name][col]
                        for p, remap in zip(parts, remaps, strict=True)
                    ]
                )
                for col, kind in LAYOUT[name]
            }
            for name in BUFFERED
        }
        return cls(tables, list(index))


Item = Record | StepBlock


class Batch:
    """Records and step blocks waiting for the next flush, plus whole numpy parts (bulk
    appends, or a batch handed back by a failed flush). Items are kept as they came (an append
    is a list extend) and turned into columns in bulk by the flush: ~2 µs less per record."""

    def __init__(self) -> None:
        self.records: list[Item] = []
        self.parts: list[Part] = []

    @property
    def empty(self) -> bool:
        return not self.records and not self.parts

    def extend(self, items: Sequence[Item]) -> None:
        for item in items:
            if isinstance(item, StepBlock):
                _check_block(item)
            elif not isinstance(item, (StepRecord, EventRecord, Heartbeat)):
                raise TypeError(
                    f"Store.append takes records, got {type(item).__name__} "
                    "(expected StepRecord, EventRecord, Heartbeat or StepBlock)"
                )
        self.records.extend(items)

    def add_columns(
        self, run: str, metric: str, rank: np.ndarray, step: np.ndarray, value: np.ndarray,
        seq: np.ndarray, t: np.ndarray, world_size: int,
    ) -> None:  # fmt: skip
        n = len(step)
        names = [run, metric, "step", ""]  # codes 0..3
        code = {i: np.full(n, i, np.int32) for i in range(4)}
        none = np.full(n, NULL_INT, dtype=np.int64)
        steps = (code[0], rank, seq, step, none, t, code[1], value)
        recs = (code[0], rank, seq, t, code[2], np.full(n, world_size, np.int64), code[3],
                np.zeros(n, np.int64), step, np.full(n, NULL_CODE, np.int32))  # fmt: skip
        part = Part.empty()
        part.names = names
        for name, cols in (("steps", steps), ("recs", recs)):
            part.tables[name] = {
                c: np.asarray(v, _DTYPE[k]) for (c, k), v in zip(LAYOUT[name], cols, strict=True)
            }
        self.parts.append(part)

    def as_parts(self) -> list[Part]:
        if not self.records:
            return list(self.parts)
        return [*self.parts, record_part(self.records)]

    def to_numpy(self) -> Part:
        return Part.merge(self.as_parts() or [Part.empty()])

    def split(self) -> tuple[Batch, Batch] | None:
        """Two batches holding this one's content, oldest first; None if it is one piece
        (a lone block of two or more records is cut in two blocks)."""
        first, second = Batch(), Batch()
        if len(self.records) >= 2:
            half = len(self.records) // 2
            first.parts, first.records = self.parts, self.records[:half]
            second.records = self.records[half:]
        elif self.records and self.parts:
            first.parts, second.records = self.parts, self.records
        elif len(self.parts) >= 2:
            half = len(self.parts) // 2
            first.parts, second.parts = self.parts[:half], self.parts[half:]
        elif self.records and isinstance(self.records[0], StepBlock) and len(self.records[0]) > 1:
            a, b = split_block(self.records[0])
            first.records, second.records = [a], [b]
        else:
            return None
        return first, second

    def absorb(self, newer: Batch, cap_rows: float) -> int:
        """Take ``newer``'s content after ours, then drop the oldest beyond ``cap_rows`` rows:
        whole parts first, then whole records and blocks (never half of one, so seq intervals
        and rows stay consistent; the newest piece always stays). Returns the rows dropped."""
        self.parts += newer.parts
        self.records += newer.records
        rows = sum(p.rows for p in self.parts) + sum(map(_record_rows, self.records))
        dropped = 0
        while rows > cap_rows and self.parts and (len(self.parts) > 1 or self.records):
            size = self.parts.pop(0).rows
            rows, dropped = rows - size, dropped + size
        gone = 0
        while rows > cap_rows and gone < len(self.records) - 1:
            size = _record_rows(self.records[gone])
            rows, dropped, gone = rows - size, dropped + size, gone + 1
        del self.records[:gone]
        return dropped


def _check_block(block: StepBlock) -> None:
    n = len(block.seq)
    for name, col in (("time", block.time), ("step", block.step), ("epoch", block.epoch),
                      *((f"metric {m!r}", v) for m, v in block.metrics.items())):  # fmt: skip
        if len(col) != n:
            raise ValueError(
                f"StepBlock of run {block.run!r} rank {block.rank}: column {name} has "
                f"{len(col)} entries for {n} records"
            )


def split_block(block: StepBlock) -> tuple[StepBlock, StepBlock]:
    """The first and second half of ``block`` as two blocks."""

    def cut(s: slice) -> StepBlock:
        metrics = {m: v[s] for m, v in block.metrics.items()}
        ident = (block.run, block.rank, block.world_size, block.host, block.pid)
        cols = (block.seq[s], block.time[s], block.step[s], block.epoch[s])
        return StepBlock(*ident, *cols, metrics)

    h = len(block) // 2
    return cut(slice(None, h)), cut(slice(h, None))


def _record_rows(item: Item) -> int:
    """Buffered rows of one record (its ``recs`` row plus its table's rows) or block."""
    if type(item) is StepBlock:
        return len(item) * (1 + max(1, len(item.metrics)))
    return 1 + max(1, len(item.metrics)) if type(item) is StepRecord else 2


_NO_METRICS = {None: math.nan}  # a step record without metrics still gets a row, so it is stored
_STEP_FIELDS = attrgetter("run", "rank", "seq", "time", "world_size", "host", "pid", "step",
                          "epoch")  # fmt: skip


def record_part(items: Sequence[Item]) -> Part:
    """Records and blocks -> numpy columns per buffered table: step records and blocks (the
    bulk) column by column, without a Python call per record; events and heartbeats row by
    row."""
    names: dict[str, int] = {}
    steps = [r for r in items if type(r) is StepRecord]
    blocks = [r for r in items if type(r) is StepBlock] if len(steps) < len(items) else []
    others = (
        [r for r in items if type(r) is not StepRecord and type(r) is not StepBlock]
        if len(steps) + len(blocks) < len(items)
        else []
    )
    cols: dict[str, list[list]] = {name: [[] for _ in LAYOUT[name]] for name in BUFFERED}
    for rec in others:
        _add_row(cols, rec)
    tables = {name: columns(name, c, names) for name, c in cols.items()}
    for made in (_step_tables(steps, names) if steps else None,
                 _block_tables(blocks, names) if blocks else None):  # fmt: skip
        if made is not None:
            tables["recs"] = _concat(tables["recs"], made[0])
            tables["steps"] = _concat(tables["steps"], made[1])
    return Part(tables, list(names))


def _step_tables(
    steps: list[StepRecord], names: dict[str, int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``recs`` and ``steps`` columns of step records: one row per (record, metric)."""
    n = len(steps)
    fields = zip(*map(_STEP_FIELDS, steps), strict=True)
    run, rank, seq, t, ws, host, pid, step, epoch = map(list, fields)
    head = {"run": _codes(run, names), "rank": np.array(rank, np.int64),
            "seq": np.array(seq, np.int64), "time": np.array(t, np.float64)}  # fmt: skip
    step_col = np.array(step, np.int64)
    recs = {**head, "kind": np.full(n, _code("step", names), np.int32),
            "world_size": np.array(ws, np.int64), "host": _codes(host, names),
            "pid": np.array(pid, np.int64), "step": step_col,
            "event": np.full(n, NULL_CODE, np.int32)}  # fmt: skip
    per = [r.metrics or _NO_METRICS for r in steps]
    counts = np.fromiter(map(len, per), np.int64, n)
    # one repeat count for all when every record has as many metrics (the usual case)
    reps: int | np.ndarray = int(counts[0]) if (counts == counts[0]).all() else counts
    rows = {c: np.repeat(v, reps) for c, v in (*head.items(), ("step", step_col),
                                                  ("epoch", _nullable(epoch)))}  # fmt: skip
    total = int(counts.sum())
    rows["metric"] = _codes([k for m in per for k in m], names)
    rows["value"] = np.fromiter(chain.from_iterable(m.values() for m in per), np.float64, total)
    return recs, rows


def _block_tables(
    blocks: list[StepBlock], names: dict[str, int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``recs`` and ``steps`` columns of step blocks, from their lists in bulk: a block of n
    records and k metrics gives k x n step rows, metric after metric (one row per record with
    metric NULL when k = 0, like a StepRecord without metrics)."""
    lens = np.fromiter(map(len, blocks), np.int64, len(blocks))
    n = int(lens.sum())

    def per_block(values: list[Any], dtype: Any) -> np.ndarray:
        return np.repeat(np.array(values, dtype), lens)

    recs = {
        "run": per_block([_code(b.run, names) for b in blocks], np.int32),
        "rank": per_block([b.rank for b in blocks], np.int64),
        "seq": np.fromiter(chain.from_iterable(b.seq for b in blocks), np.int64, n),
        "time": np.fromiter(chain.from_iterable(b.time for b in blocks), np.float64, n),
        "kind": np.full(n, _code("step", names), np.int32),
        "world_size": per_block([b.world_size for b in blocks], np.int64),
        "host": per_block([_code(b.host, names) for b in blocks], np.int32),
        "pid": per_block([b.pid for b in blocks], np.int64),
        "step": np.fromiter(chain.from_iterable(b.step for b in blocks), np.int64, n),
        "event": np.full(n, NULL_CODE, np.int32),
    }
    epoch = _nullable(list(chain.from_iterable(b.epoch for b in blocks)))
    # row -> record: block j's rows are k_j passes over its records
    ks = np.array([max(1, len(b.metrics)) for b in blocks], np.int64)
    if (lens == n // len(blocks)).all() and (ks == ks[0]).all() and len(blocks) > 1:
        width, k = int(lens[0]), int(ks[0])  # the usual case: blocks of one shape
        ridx = (np.arange(len(blocks) * k) // k * width)[:, None] + np.arange(width)
        ridx = ridx.ravel()
    else:
        per_rows = lens * ks
        blk = np.repeat(np.arange(len(blocks)), per_rows)
        pos = np.arange(int(per_rows.sum())) - np.repeat(np.cumsum(per_rows) - per_rows, per_rows)
        ridx = np.repeat(np.cumsum(lens) - lens, per_rows) + pos % np.maximum(lens[blk], 1)
    metric_codes = [
        code for b in blocks for code in ([_code(m, names) for m in b.metrics] or [NULL_CODE])
    ]
    values = chain.from_iterable(
        (b.metrics.values() if b.metrics else ([math.nan] * len(b),)) for b in blocks
    )
    rows = {c: recs[c][ridx] for c in ("run", "rank", "seq", "step")}
    rows["epoch"] = epoch[ridx]
    rows["time"] = recs["time"][ridx]
    rows["metric"] = np.repeat(np.array(metric_codes, np.int32), np.repeat(lens, ks))
    rows["value"] = np.fromiter(chain.from_iterable(values), np.float64, len(ridx))
    return recs, {c: rows[c] for c, _ in LAYOUT["steps"]}


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


def ranks_values(rows: Sequence[RankRow]) -> str:
    """``rows`` as an SQL VALUES list (a few rows per flush: no numpy table to register)."""
    return ", ".join(
        "(" + ", ".join(sql_value(getattr(r, f)) for f in RANK_FIELDS) + ")" for r in rows
    )


def sql_value(value: Any) -> str:
    """A literal for a None, bool, int, float or str; floats parse back to the same double."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return f"'{value!r}'::DOUBLE"
    return rollup.literal(str(value))


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
