"""The store's row layout and bookkeeping: table definitions, records rebuilt from rows, and
the in-memory summaries (``Mirror``) that runs(), query planning and the band frontier read.
The write buffer is ``buffer.py``, its columns ``parts.py``. Only the store uses them."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import duckdb
import numpy as np
from rankwatch.agent.wire.records import EventRecord, Heartbeat, Record, StepRecord
from rankwatch.aggregator.store import commands, incidents, openbuckets, rollup, stacks, telemetry
from rankwatch.aggregator.store.seen import SeenSeqs
from rankwatch.aggregator.store.seen import load as load_seen

# Column kinds: "c" a repeated string (run, metric, host...) as an int32 code into the part's
# name table (NULL_CODE: NULL), "s" free text as Python objects (event info), "i" int,
# "n" nullable int, "f" float, "b" bool. DuckDB reads numpy columns zero-copy but turns NaN into
# NULL and cannot type an int column holding None, so nullable ints travel as NULL_INT and
# floats get their NaN back in SQL. An object column it reads one Python string at a time,
# taking the GIL for each chunk and handing it back: with the ingest thread busy each hand-over
# waits for a switch interval (figures: docs/benchmarks.md, Ingest), hence codes.
NULL_INT = -(2**63)
NULL_CODE = -1
_T = {"c": "VARCHAR", "s": "VARCHAR", "i": "BIGINT", "n": "BIGINT", "f": "DOUBLE", "b": "BOOLEAN"}
DTYPE: dict[str, Any] = {
    "c": np.int32, "s": object, "i": np.int64, "n": np.int64, "f": np.float64, "b": bool,
}  # fmt: skip
LAYOUT: dict[str, tuple[tuple[str, str], ...]] = {
    # inc (the agent's incarnation) came later: it is the last column of every table with it
    "steps": (("run", "c"), ("rank", "i"), ("seq", "i"), ("step", "i"), ("epoch", "n"),
              ("time", "f"), ("metric", "c"), ("value", "f"), ("inc", "i")),
    "events": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("world_size", "i"),
               ("host", "c"), ("pid", "i"), ("event", "c"), ("step", "n"), ("info", "s"),
               ("inc", "i")),
    "heartbeats": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("last_step", "n"),
                   ("next_in", "f"), ("dropped", "i"), ("paused", "c"), ("inc", "i")),
    # seq intervals, rank summaries, rank_meta. One row per span of buffered records: a step
    # block with consecutive seqs is one row (seq..hi, n records, its first and last time, its
    # last step), any other record its own row (hi = seq, n = 1). inc: the agent's incarnation.
    # ``step`` is read for step records only (0 for others): as a nullable column, step -2**63
    # would read as NULL.
    "recs": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("kind", "c"),
             ("world_size", "n"), ("host", "c"), ("pid", "n"), ("step", "i"), ("event", "c"),
             ("hi", "i"), ("n", "i"), ("last_time", "f"), ("inc", "i")),
    # telemetry: one row per value, one per label (kept where it changes: store/telemetry.py)
    "telemetry": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"), ("source", "c"),
                  ("device", "c"), ("name", "c"), ("value", "f"), ("inc", "i")),
    "telemetry_labels": (("run", "c"), ("rank", "i"), ("seq", "i"), ("time", "f"),
                         ("source", "c"), ("device", "c"), ("name", "c"), ("value", "c"),
                         ("inc", "i")),
    "ranks": (("run", "c"), ("rank", "i"), ("world_size", "n"), ("host", "c"), ("pid", "n"),
              ("first_time", "f"), ("last_time", "f"), ("records", "i"), ("last_step", "n"),
              ("meta_seq", "n"), ("life_seq", "n"), ("ended", "b"), ("inc", "i")),
}  # fmt: skip
BUFFERED = ("steps", "events", "heartbeats", "recs", "telemetry", "telemetry_labels")

TABLES = (
    *(
        f"{name} ({', '.join(f'{c} {_T[k]}' for c, k in LAYOUT[name])})"
        for name in ("steps", "events", "heartbeats", "ranks", "telemetry", "telemetry_labels")
    ),
    "rank_meta (run VARCHAR, rank BIGINT, seq BIGINT, world_size BIGINT, host VARCHAR, "
    "pid BIGINT, inc BIGINT DEFAULT 0)",  # change log: world_size/host/pid from this seq on
    # seen seqs per (run, rank, inc): a log of intervals that may overlap (seen.py)
    "seqs (run VARCHAR, rank BIGINT, lo BIGINT, hi BIGINT, inc BIGINT DEFAULT 0)",
    "band (run VARCHAR, metric VARCHAR, step BIGINT, n BIGINT, nonfinite BIGINT, "
    "median DOUBLE, p5 DOUBLE, p95 DOUBLE, vmin DOUBLE, vmax DOUBLE)",
    "band_done (run VARCHAR, done BIGINT)",  # last settled band step of a run
    "band_late (run VARCHAR, metric VARCHAR, step BIGINT)",  # earliest value after settling
    "meta (key VARCHAR, value VARCHAR)",
    incidents.TABLE,
    stacks.TABLE,
    *telemetry.TABLES,
    commands.TABLE,
)


# --- the bookkeeping a flush does in SQL over its batch (temp table buf_recs) ----------

# A store made before incarnations gets the columns (its rows are incarnation 0).
ADD_INC = ";".join(
    f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS inc BIGINT DEFAULT 0"
    for t in ("steps", "events", "heartbeats", "ranks", "rank_meta", "seqs")
)

# Where a rank's world_size/host/pid start (its first record, a restart elsewhere): the first
# seq of each identity in this flush that differs from the one before it (the rank's previous
# identity in the flush, else its ``ranks`` row, which the mirror holds too), in seq order. A
# hash aggregate, then a window over its few rows (one per rank, not per record): a flush of
# thousands of ranks returns the few that changed, not a row per rank to compare in Python.
# An incarnation's seqs are its own: each starts its own identities.
META_BATCH = """
SELECT m.run, m.rank, m.seq, m.world_size, m.host, m.pid, m.inc FROM (
  SELECT *, lag((world_size, host, pid, inc)) OVER (PARTITION BY run, rank ORDER BY seq, inc)
    AS before
  FROM (SELECT run, rank, min(seq) AS seq, world_size, host, pid, inc FROM buf_recs
        WHERE world_size IS NOT NULL GROUP BY run, rank, world_size, host, pid, inc)
) m LEFT JOIN ranks r ON r.run = m.run AND r.rank = m.rank
WHERE (m.world_size, m.host, m.pid, m.inc)
  IS DISTINCT FROM coalesce(m.before, (r.world_size, r.host, r.pid, r.inc))
"""

RANK_BATCH = """
SELECT run, rank, CAST(sum(n) AS BIGINT) AS records, min(time) AS first_time,
  max(last_time) AS last_time, max(step) FILTER (WHERE kind = 'step') AS last_step,
  arg_max(world_size, seq) FILTER (WHERE world_size IS NOT NULL) AS world_size,
  arg_max(host, seq) FILTER (WHERE world_size IS NOT NULL) AS host,
  arg_max(pid, seq) FILTER (WHERE world_size IS NOT NULL) AS pid,
  max(hi) FILTER (WHERE world_size IS NOT NULL) AS meta_seq,
  max(seq) FILTER (WHERE event IN ('start', 'end', 'crash')) AS life_seq,
  arg_max(event, seq) FILTER (WHERE event IN ('start', 'end', 'crash')) AS life, inc
FROM buf_recs GROUP BY run, rank, inc
"""


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


def read_records(con: duckdb.DuckDBPyConnection, run: str) -> Iterator[Record]:
    cur = con.cursor()
    try:
        events: list[Record] = [
            EventRecord(run, rank, seq, time, size, host, pid, event, step, json.loads(info), inc)
            for rank, seq, time, size, host, pid, event, step, info, inc in cur.execute(
                "SELECT rank, seq, time, world_size, host, pid, event, step, info, inc FROM events "
                "WHERE run = ? ORDER BY rank, inc, seq",
                [run],
            ).fetchall()
        ]
        beats: list[Record] = [
            Heartbeat(run, *row)
            for row in cur.execute(
                "SELECT rank, seq, time, last_step, next_in, dropped, paused, inc FROM heartbeats "
                "WHERE run = ? ORDER BY rank, inc, seq",
                [run],
            ).fetchall()
        ]
        yield from heapq.merge(
            _step_records(cur, run), events, beats, key=lambda r: (r.rank, r.inc, r.seq)
        )
    finally:
        cur.close()


def _step_records(cur: duckdb.DuckDBPyConnection, run: str) -> Iterator[StepRecord]:
    # world_size/host/pid of a step record: its incarnation's latest rank_meta entry at or
    # before its seq
    cur.execute(
        "SELECT s.rank, s.seq, s.time, m.world_size, m.host, m.pid, s.step, s.epoch, s.metric, "
        "s.value, s.inc FROM steps s ASOF LEFT JOIN rank_meta m "
        "ON s.run = m.run AND s.rank = m.rank AND s.inc = m.inc AND s.seq >= m.seq "
        "WHERE s.run = ? ORDER BY s.rank, s.inc, s.seq",
        [run],
    )
    head: tuple | None = None
    metrics: dict[str, float] = {}
    while rows := cur.fetchmany(10_000):
        for row in rows:
            if head is not None and (row[0], row[1], row[10]) != (head[0], head[1], head[10]):
                yield _step_record(run, head, metrics)
                metrics = {}
            head = row
            if row[8] is not None:
                metrics[row[8]] = row[9]
    if head is not None:
        yield _step_record(run, head, metrics)


def _step_record(run: str, row: tuple, metrics: dict[str, float]) -> StepRecord:
    rank, seq, t, ws, host, pid, step, epoch = row[:8]
    return StepRecord(
        run, rank, seq, t, ws or 1, host or "", pid or 0, step, epoch, metrics, row[10]
    )


# --- in-memory summaries: what runs(), metrics(), query planning and the band frontier read ---


class RankRow(NamedTuple):
    """One row of the ``ranks`` table: a rank's summary, rewritten at each flush touching it.
    A tuple: a flush of thousands of ranks makes one per rank (``merge_ranks``), and a frozen
    dataclass costs a call per field to make."""

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
    inc: int = 0  # the incarnation meta_seq, life_seq and last_step are of (its newest)

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


RANK_FIELDS = RankRow._fields


@dataclass(frozen=True, slots=True)
class MetricStats:
    """Rows, step span and ranks of one (run, metric): enough to pick a level without a query."""

    metric: str
    rows: int
    lo: int
    hi: int
    keys: frozenset[int]


def _summary(run: str, rows: list[RankRow]) -> dict[str, Any]:
    return {
        "run": run,
        "world_size": max((r.world_size or 0 for r in rows), default=0) or None,
        "ranks": len(rows),
        "first_time": min(r.first_time for r in rows),
        "last_time": max(r.last_time for r in rows),
        "records": sum(r.records for r in rows),
        "last_step": max((r.last_step for r in rows if r.last_step is not None), default=None),
    }


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
    tele: dict[str, telemetry.TeleRun] = field(default_factory=dict)  # run -> its telemetry
    tele_done: dict[tuple[str, int], float] = field(default_factory=dict)  # rolled up to
    # run -> (its rank rows' dict, the summary made of it): a published mirror's per-run dicts
    # never change (merge_ranks replaces them), so a summary holds while its dict is the same
    # object. Shared by copies; ``runs()`` at 100,000 ranks is otherwise a pass over every rank.
    summaries: dict[str, tuple[dict[int, RankRow], dict[str, Any]]] = field(default_factory=dict)
    opens: openbuckets.OpenBuckets = field(
        default_factory=openbuckets.OpenBuckets
    )  # the series' open buckets
    seen: SeenSeqs = field(default_factory=SeenSeqs)  # the merged seq intervals (seen.py)

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection) -> Mirror:
        m = cls()
        for row in cur.execute(f"SELECT {', '.join(RANK_FIELDS)} FROM ranks").fetchall():
            m.ranks.setdefault(row[0], {})[row[1]] = RankRow(*row)
        m.band = dict(cur.execute("SELECT run, done FROM band_done").fetchall())
        m.tele, m.tele_done = telemetry.load(cur)
        for run, metric, step in cur.execute("SELECT * FROM band_late").fetchall():
            m.late[(run, metric)] = step
        m.opens = openbuckets.load(cur)  # current on disk here (Store recovers them first)
        m.seen = load_seen(cur)
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
        return Mirror(dict(self.ranks), dict(self.stats), dict(self.band), dict(self.late),
                      dict(self.tele), dict(self.tele_done), self.summaries,
                      self.opens, self.seen)  # fmt: skip

    def merge_ranks(self, rows: list[tuple]) -> list[RankRow]:
        """Fold a flush's per-rank aggregates (RANK_BATCH, one row per incarnation) in; returns
        the new rows. Seqs order the records of one incarnation only: a newer incarnation (its
        first record after the rank's last) brings its own identity, life and last step; an
        earlier one's records (an import, a late resend) only add to the counts."""
        changed: dict[tuple[str, int], RankRow] = {}
        for run in {row[0] for row in rows}:
            self.ranks[run] = dict(self.ranks.get(run, {}))
        for row_ in sorted(rows, key=lambda r: r[3]):  # incarnations in the order they began
            run, rank, n, t0, t1, last_step, ws, host, pid, meta_seq, life_seq, life, inc = row_
            old = self.ranks[run].get(rank)
            same = old is None or old.inc == inc
            newer = not same and old is not None and t0 >= old.last_time
            if not same and not newer:  # an earlier incarnation: its seqs say nothing here
                meta_seq = life_seq = None
            new_meta = meta_seq is not None and (
                old is None or old.meta_seq is None or newer or meta_seq > old.meta_seq
            )
            new_life = life_seq is not None and (
                old is None or old.life_seq is None or newer or life_seq > old.life_seq
            )
            if newer:  # the last step and the life are the new process's from here on
                assert old is not None
                old = old._replace(last_step=None, life_seq=None, ended=False)
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
                inc=inc if old is None or newer else old.inc,
            )
            self.ranks[run][rank] = changed[(run, rank)] = row
        return list(changed.values())

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
        out = []
        for run, by_rank in self.ranks.items():
            if not by_rank:
                continue
            kept = self.summaries.get(run)
            if kept is None or kept[0] is not by_rank:
                kept = self.summaries[run] = (by_rank, _summary(run, list(by_rank.values())))
            out.append(dict(kept[1]))
        for gone in self.summaries.keys() - self.ranks.keys():
            self.summaries.pop(gone, None)
        return sorted(out, key=lambda r: r["first_time"])
