"""The series rollups' open buckets, kept in memory between flushes (``OpenBuckets``).

Each key (run, metric, rank) has one open bucket per level (rollup.py). Kept in the
``series_l<w>_open`` tables, every flush deleted and rewrote the open bucket of every rank it
touched at every level, and committed those rows: at a thousand ranks that was most of a
flush's rollup cost and a good part of its commit (docs/benchmarks.md). Here they live in numpy
columns: a flush folds its rows into them in SQL (the same aggregates as ``rollup.fold``, the
open rows scanned where they lie), writes only the buckets that closed, and gets the new open
rows back. Readers take the rows of their run and metric from the published snapshot.

On disk the open tables are written at ``close`` (``save_sql``), marked ``saved`` in ``meta``;
the first flush after marks them ``live`` (stale). A store opened while ``live`` (the process was
killed) rebuilds them from what every flush committed (``recover_sql``): the open bucket of a
level is, per key, its latest bucket of the rows below it (the raw rows for the finest level,
the closed buckets of the level below for the others), which no closed bucket holds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np
from rankwatch.aggregator.store import rollup
from rankwatch.aggregator.store.rollup import FANOUT, LEVELS

MARK = "series_open"  # meta key: "saved" (the open tables are current) or "live" (stale)
COLS = ("key", "b", "n", "s", "mn", "mn_step", "mx", "mx_step", "lo", "hi")
_DTYPES = (np.int32, np.int64, np.int64, np.float64, np.float64, np.int64, np.float64,
           np.int64, np.int64, np.int64)  # fmt: skip
_PAIR = "(SELECT runs FROM buf_pairs)[pair + 1] AS run, (SELECT metrics FROM buf_pairs)" \
    "[pair + 1] AS metric"  # fmt: skip
_BUCKET = ", ".join(COLS)
_KEY_BIAS = 2**31  # keys are int32: biased to be >= 0 in the combined (pair, key) sort key

Columns = dict[str, np.ndarray]


def empty() -> Columns:
    return {"pair": np.zeros(0, np.int64)} | {
        c: np.zeros(0, t) for c, t in zip(COLS, _DTYPES, strict=True)
    }


def _order(cols: Columns) -> np.ndarray:
    return (cols["pair"].astype(np.int64) << 32) | (cols["key"].astype(np.int64) + _KEY_BIAS)


@dataclass(frozen=True, eq=False)
class OpenBuckets:
    """Per level, every key's open bucket as columns sorted by (pair, key); ``pair`` codes
    a (run, metric). A published snapshot is never changed: ``replaced`` makes the next."""

    pairs: dict[tuple[str, str], int] = field(default_factory=dict)
    levels: tuple[Columns, ...] = tuple(empty() for _ in LEVELS)
    saved: bool = True  # the open tables on disk hold these rows

    def code(self, run: str, metric: str) -> int:
        """The pair's code, new ones numbered on (``pairs`` is shared by snapshots and only
        grows, under the flush lock)."""
        return self.pairs.setdefault((run, metric), len(self.pairs))

    def rows(self, level: int, run: str, metric: str, keys: Sequence[int] | None) -> Columns:
        """The open rows of (run, metric) at ``level``, of ``keys`` only if given."""
        pair = self.pairs.get((run, metric))
        cols = self.levels[level]
        if pair is None:
            return {c: v[:0] for c, v in cols.items()}
        order = _order(cols)
        lo, hi = np.searchsorted(order, [pair << 32, (pair + 1) << 32])
        out = {c: v[lo:hi] for c, v in cols.items()}
        if keys is not None:
            keep = np.isin(out["key"], np.asarray(list(keys), dtype=np.int64))
            out = {c: v[keep] for c, v in out.items()}
        return out

    def as_rows(self) -> list[tuple]:
        """Every open bucket as (run, metric, level index, key, b, n, s, ...), sorted."""
        names = {code: pair for pair, code in self.pairs.items()}
        out = []
        for i, cols in enumerate(self.levels):
            rows = zip(*(cols[c].tolist() for c in COLS), strict=True)
            for pair, row in zip(cols["pair"].tolist(), rows, strict=True):
                out.append((*names[pair], i, *row))
        return sorted(out)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpenBuckets):
            return NotImplemented
        return self.saved == other.saved and repr(self.as_rows()) == repr(other.as_rows())

    __hash__ = None  # type: ignore[assignment]

    def for_pairs(self, level: int, pairs: np.ndarray) -> Columns:
        """The open rows of the pairs ``pairs`` (sorted global codes), pair renumbered to its
        position in ``pairs`` (the flush's own numbering)."""
        cols = self.levels[level]
        keep = np.isin(cols["pair"], pairs)
        out = {c: v[keep] for c, v in cols.items()}
        out["pair"] = np.searchsorted(pairs, out["pair"]).astype(np.int32)
        return out

    def replaced(self, news: Sequence[Columns | None], saved: bool) -> OpenBuckets:
        """A snapshot where each level's rows of the keys in ``news[level]`` (global pair
        codes; None: none) are those rows."""
        levels = []
        for old, new in zip(self.levels, news, strict=True):
            if new is None or not len(new["key"]):
                levels.append(old)
                continue
            keep = ~np.isin(_order(old), _order(new))
            cat = {c: np.concatenate([old[c][keep], new[c].astype(old[c].dtype)]) for c in old}
            order = np.argsort(_order(cat), kind="stable")
            levels.append({c: v[order] for c, v in cat.items()})
        return OpenBuckets(self.pairs, tuple(levels), saved)


def fold(
    cur: duckdb.DuckDBPyConnection,
    opens: OpenBuckets,
    pairs: np.ndarray,
    part_sql: str,
    before: Sequence[str],
) -> tuple[list[str], list[Columns | None]]:
    """``rollup.fold`` for the series with the open buckets in memory: fold the finest
    level's new buckets (``part_sql``: pair, key, b and the aggregates; ``pair`` indexes
    ``pairs``, the global codes, and the temp table ``buf_pairs`` holds its names) into every
    level. Only closed buckets are written; returns the statements left to run (the caller's
    transaction) and each level's new open rows (global pair codes; None: level untouched)."""
    key = "p.pair = o.pair AND p.key = o.key"
    part = part_sql
    script = list(before)
    news: list[Columns | None] = [None] * len(LEVELS)
    # found by name by DuckDB while the statements below run (a replacement scan: no
    # register(), see write.py)
    open_0, open_1, open_2 = (opens.for_pairs(i, pairs) for i in range(len(LEVELS)))
    for i, width in enumerate(LEVELS):
        closed_t, comb = rollup.table("series", width), f"rw_comb{i}"
        script += [
            f"""CREATE OR REPLACE TEMP TABLE {comb} AS
            WITH p AS MATERIALIZED ({part}),
            u AS (SELECT pair, {_BUCKET}, false AS old FROM p
                  UNION ALL SELECT o.pair, {", ".join(f"o.{c}" for c in COLS)}, true
                  FROM (SELECT pair, {rollup.NUMPY_BUCKET} FROM open_{i}) o SEMI JOIN p ON {key}),
            g AS (SELECT u.pair, u.key, u.b, {rollup.MERGE_AGG}, bool_or(u.old) AS old
                  FROM u GROUP BY u.pair, u.key, u.b)
            SELECT pair, {_BUCKET}, b = max(b) OVER k AS is_open,
                   coalesce(b < max(CASE WHEN old THEN b END) OVER k, false) AS late
            FROM g WINDOW k AS (PARTITION BY pair, key)""",
        ]
        got = cur.execute(";\n".join([*script, (
            f"SELECT pair, {_BUCKET}, (SELECT count(*) FILTER (WHERE late) FROM {comb}) AS late,"
            f" (SELECT count(*) FILTER (WHERE NOT is_open) FROM {comb}) AS closed "
            f"FROM {comb} WHERE is_open"
        )])).fetchnumpy()  # fmt: skip
        late, closed = (int(got[c][0]) if len(got[c]) else 0 for c in ("late", "closed"))
        news[i] = {"pair": pairs[np.asarray(got["pair"], dtype=np.int64)]} | {
            c: np.asarray(got[c]) for c in COLS
        }
        script = rollup.close_sql(comb, closed_t, f"{_PAIR}, {_BUCKET}", late, closed)
        if not closed or i + 1 == len(LEVELS):
            break
        # Deltas (not merged totals) go up, so a coarser bucket counts each row once.
        part = (
            f"SELECT u.pair, u.key, u.b // {FANOUT} AS b, {rollup.MERGE_AGG} FROM {comb} u "
            f"WHERE NOT u.is_open GROUP BY u.pair, u.key, u.b // {FANOUT}"
        )
    del open_0, open_1, open_2
    return script, news


def mark_sql(state: str) -> list[str]:
    return [f"DELETE FROM meta WHERE key = '{MARK}'", f"INSERT INTO meta VALUES ('{MARK}', "
            f"'{state}')"]  # fmt: skip


def saved(cur: duckdb.DuckDBPyConnection) -> bool:
    """Whether the open tables on disk are current (a store without the mark: written by a
    version that kept them current at every flush)."""
    row = cur.execute(f"SELECT value FROM meta WHERE key = '{MARK}'").fetchone()
    return row is None or row[0] == "saved"


def recover_sql() -> list[str]:
    """The open tables rebuilt from the committed rows (see the module docstring)."""
    out = []
    for i, width in enumerate(LEVELS):
        open_t = rollup.table("series", width, True)
        if i == 0:
            src = (
                "SELECT run, metric, CAST(rank AS INTEGER) AS key, step // "
                f"{width} AS b, step, value FROM steps WHERE metric IS NOT NULL"
            )
            agg = rollup.RAW_AGG
        else:
            src = (
                f"SELECT run, metric, key, b // {FANOUT} AS b, n, s, mn, mn_step, mx, mx_step, "
                f"lo, hi FROM {rollup.table('series', LEVELS[i - 1])}"
            )
            agg = rollup.MERGE_AGG
        out += [
            f"DELETE FROM {open_t}",
            f"""INSERT INTO {open_t} WITH u AS MATERIALIZED ({src}),
            m AS (SELECT run, metric, key, max(b) AS b FROM u GROUP BY run, metric, key)
            SELECT u.run, u.metric, u.key, u.b, {agg} FROM u SEMI JOIN m
            ON u.run = m.run AND u.metric = m.metric AND u.key = m.key AND u.b = m.b
            GROUP BY u.run, u.metric, u.key, u.b""",
        ]
    return out


def load(cur: duckdb.DuckDBPyConnection) -> OpenBuckets:
    """The open tables (current: ``saved``, or just recovered) into memory."""
    opens = OpenBuckets(pairs={})
    levels = []
    for width in LEVELS:
        res = cur.execute(
            f"SELECT run, metric, {_BUCKET} FROM {rollup.table('series', width, True)}"
        ).fetchnumpy()
        code = opens.code
        cols = {
            "pair": np.array(
                [code(r, m) for r, m in zip(res["run"], res["metric"], strict=True)], dtype=np.int64
            )
        }
        cols |= {c: np.asarray(res[c]).astype(t) for c, t in zip(COLS, _DTYPES, strict=True)}
        order = np.argsort(_order(cols), kind="stable")
        levels.append({c: v[order] for c, v in cols.items()})
    return OpenBuckets(opens.pairs, tuple(levels), True)


def save(cur: duckdb.DuckDBPyConnection, opens: OpenBuckets) -> None:
    """Write the open buckets to their tables and mark them saved, in one transaction."""
    names = sorted(opens.pairs.items(), key=lambda kv: kv[1])
    raw_pairs = {
        "i": np.arange(len(names), dtype=np.int64),
        "run": np.array([r for (r, _), _ in names], dtype=object),
        "metric": np.array([m for (_, m), _ in names], dtype=object),
    }
    script = [
        "BEGIN TRANSACTION",
        "CREATE OR REPLACE TEMP TABLE buf_pairs AS SELECT list(CAST(run AS VARCHAR) ORDER BY i) "
        "AS runs, list(CAST(metric AS VARCHAR) ORDER BY i) AS metrics FROM raw_pairs",
    ]
    level_0, level_1, level_2 = opens.levels
    for i, width in enumerate(LEVELS):
        open_t = rollup.table("series", width, True)
        script += [
            f"DELETE FROM {open_t}",
            f"INSERT INTO {open_t} SELECT {_PAIR}, {rollup.NUMPY_BUCKET} FROM level_{i}",
        ]
    try:
        rollup.run_script(cur, [*script, *mark_sql("saved"), "COMMIT"])
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            cur.execute("ROLLBACK")
        raise
    del raw_pairs, level_0, level_1, level_2


class Gate:
    """Readers share it; the flush's commit and the swap of the open buckets it made take it
    alone, so a read never pairs one flush's closed rows with another's open ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._waiting:  # a waiting commit goes first
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._readers or self._writing:
                self._cond.wait()
            self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
