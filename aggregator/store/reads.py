"""The store's read queries, and the cursors they run on.

Reads run on a small pool of DuckDB cursors (``Cursors``), taken for one query and given back:
any thread may read, at most ``READ_CURSORS`` at once, and a thread that ends leaves nothing
behind (one cursor per thread grew by a cursor, ~10 kB, for every short-lived thread that ever
asked). Queries see committed flushes only. The numbers they plan with come from the store's
in-memory ``Mirror`` (rows.py), passed in.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from rankwatch.agent.wire.records import Record
from rankwatch.aggregator.store import columns, lives, openbuckets, rollup
from rankwatch.aggregator.store import commands as stored_commands
from rankwatch.aggregator.store import incidents as stored_incidents
from rankwatch.aggregator.store import stacks as stored_stacks
from rankwatch.aggregator.store.columns import SeriesColumns
from rankwatch.aggregator.store.rows import MetricStats, Mirror, read_records
from rankwatch.aggregator.store.schema import StoreError

READ_CURSORS = 4  # queries running at once; more wait for a cursor (queries take ms)
# ``latest_values`` looks this many steps back from a metric's newest stored step: a rank that
# stopped before has no latest value, and the query never scans a long run's whole history.
LATEST_WINDOW_STEPS = 1000

Plan = tuple[int, int, int, str, dict[str, Any]]  # level, lo, hi, WHERE, parameters


class Cursors:
    """A bounded pool of read cursors of one connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, size: int = READ_CURSORS) -> None:
        self._con = con
        self._slots = threading.BoundedSemaphore(size)
        self._idle: queue.SimpleQueue[duckdb.DuckDBPyConnection] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._all: list[duckdb.DuckDBPyConnection] = []
        self._closed = False

    @property
    def count(self) -> int:
        """Cursors made so far (never more than the pool's size)."""
        return len(self._all)

    @contextlib.contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._slots:
            try:
                cur = self._idle.get_nowait()
            except queue.Empty:
                with self._lock:
                    if self._closed:
                        raise duckdb.ConnectionException("the store is closed") from None
                    cur = self._con.cursor()
                    self._all.append(cur)
            try:
                yield cur
            finally:
                self._idle.put(cur)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for cur in self._all:
                cur.close()


def events(cur: duckdb.DuckDBPyConnection, run: str) -> list[dict[str, Any]]:
    rows = cur.execute(
        "SELECT run, rank, seq, time, world_size, host, pid, event, step, info FROM events "
        "WHERE run = ? ORDER BY time, rank, seq",
        [run],
    )
    names = [d[0] for d in rows.description]
    out = [dict(zip(names, row, strict=True)) for row in rows.fetchall()]
    for ev in out:
        ev["info"] = json.loads(ev["info"])
    return out


def heartbeats(cur: duckdb.DuckDBPyConnection, run: str) -> list[dict[str, Any]]:
    rows = cur.execute(
        "SELECT run, rank, arg_max(seq, seq) AS seq, arg_max(time, seq) AS time, "
        "arg_max(last_step, seq) AS last_step, arg_max(next_in, seq) AS next_in, "
        "arg_max(dropped, seq) AS dropped, arg_max(paused, seq) AS paused, count(*) AS count "
        "FROM heartbeats WHERE run = ? GROUP BY run, rank ORDER BY rank",
        [run],
    )
    names = [d[0] for d in rows.description]
    return [dict(zip(names, row, strict=True)) for row in rows.fetchall()]


def plan(
    run: str,
    metric: str,
    stats: MetricStats | None,
    ranks: Sequence[int] | None,
    start: int | None,
    end: int | None,
    max_points: int,
    points_per_bucket: int,
) -> Plan | None:
    """Level, step range, WHERE clause and parameters for a query, or None if empty."""
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2, got {max_points}")
    if stats is None:
        return None
    lo = stats.lo if start is None else max(int(start), stats.lo)
    hi = stats.hi if end is None else min(int(end), stats.hi)
    keys = stats.keys if ranks is None else stats.keys & {int(r) for r in ranks}
    if hi < lo or not keys:
        return None
    per_key = stats.rows / len(stats.keys) * (hi - lo + 1) / (stats.hi - stats.lo + 1)
    # the band reads BAND_KEYS rows per bucket, a series one per rank
    width = rollup.BAND_KEYS if points_per_bucket == 1 else len(keys)
    all_keys = len(stats.keys) if ranks is not None and points_per_bucket != 1 else None
    level = rollup.choose_level(
        per_key, hi - lo + 1, max_points, points_per_bucket, width, all_keys
    )
    where = "run = $run AND metric = $metric"
    if ranks is not None:
        where += f" AND key IN ({', '.join(str(k) for k in sorted(keys))})"
    return level, lo, hi, where, {"run": run, "metric": metric}


def series_columns(
    cur: duckdb.DuckDBPyConnection,
    plan: Plan,
    max_points: int,
    opens: Sequence[openbuckets.Columns],
) -> SeriesColumns:
    """``opens``: the open buckets of the plan's keys per level (``OpenBuckets.rows``)."""
    level, lo, hi, where, params = plan
    # cur.sql(): DuckDB's relation path converts to numpy about twice as fast as
    # execute()'s result (bench/overlay_query.py), and the conversion is most of a big
    # overlay's query time.
    if level < 0:
        res = cur.sql(
            f"SELECT rank AS key, step, value FROM steps WHERE "
            f"{where.replace('key', 'rank')} AND step BETWEEN $lo AND $hi",
            params={**params, "lo": lo, "hi": hi},
        ).fetchnumpy()
        res = rollup.sort_buckets(res, "step")
        out = SeriesColumns.from_rows(res["key"], res["step"], res["value"])
    else:
        width = rollup.LEVELS[level]
        live_0, live_1, live_2 = opens  # found by name by DuckDB (a replacement scan)
        sql = rollup.bucket_sql("series", level, where, lo // width, hi // width, opens="live_")
        # no ``b`` column: a bucket's minimum's step orders buckets just as well
        res = rollup.sort_buckets(
            cur.sql(
                f"SELECT key, mn, mn_step, mx, mx_step FROM ({sql})", params=params
            ).fetchnumpy(),
            "mn_step",
        )
        del live_0, live_1, live_2
        out = columns.bucket_columns(
            res["key"], res["mn"], res["mn_step"], res["mx"], res["mx_step"], lo, hi
        )
    return columns.minmax_reduce(out, max_points)


def band_columns(
    cur: duckdb.DuckDBPyConnection, plan: Plan, done: int | None, max_points: int
) -> dict[str, np.ndarray]:
    """The band over ``plan``: settled steps (up to ``done``; None: none settled) from the
    band's tables, later ones computed from the raw rows."""
    level, lo, hi, where, params = plan
    params = {**params, "lo": lo, "hi": hi}
    # plain comparisons (no OR on a flag), so DuckDB can skip row groups by their step range
    after, upto = "", "false"
    if done is not None:
        params["done"] = done
        after, upto = " AND step > $done", "step <= $done"
    tail = rollup.band_wide_sql(
        f"run = $run AND metric = $metric{after} AND step BETWEEN $lo AND $hi"
    )
    if level < 0:
        sql = (
            "SELECT step, median, p5, p95, vmin, vmax FROM band WHERE run = $run AND "
            f"metric = $metric AND {upto} AND step BETWEEN $lo AND $hi "
            f"UNION ALL SELECT step, median, p5, p95, vmin, vmax FROM ({tail}) ORDER BY step"
        )
    else:
        width = rollup.LEVELS[level]
        tail_buckets = f"WITH w AS MATERIALIZED ({tail}) " + rollup.band_part_sql("w", width)
        sql = rollup.band_pivot_sql(
            rollup.bucket_sql("band", level, where, lo // width, hi // width, tail_buckets)
        )
    res = cur.sql(sql, params=params).fetchnumpy()
    out = {"step": np.asarray(res["step"]).astype(np.int64)}
    for name, col in zip(columns.BAND_KEYS[1:], rollup.BAND_COLUMNS, strict=True):
        out[name] = np.ma.filled(np.ma.asarray(res[col], dtype=np.float64), math.nan)
    return columns.band_reduce(out, max_points)


def latest_values(
    cur: duckdb.DuckDBPyConnection, run: str, metric: str, lo: int
) -> tuple[np.ndarray, np.ndarray]:
    res = cur.sql(
        "SELECT rank, arg_max(value, step) AS value FROM steps WHERE run = $run AND "
        "metric = $metric AND step >= $lo GROUP BY rank ORDER BY rank",
        params={"run": run, "metric": metric, "lo": lo},
    ).fetchnumpy()
    values = np.ma.filled(np.ma.asarray(res["value"], dtype=np.float64), math.nan)
    return np.asarray(res["rank"], dtype=np.int64), values


def export_steps(cur: duckdb.DuckDBPyConnection, run: str, out_path: Path, fmt: str) -> int:
    options = "FORMAT CSV, HEADER" if fmt == "csv" else "FORMAT PARQUET"
    target = str(out_path).replace("'", "''")
    row = cur.execute(
        "COPY (SELECT run, rank, step, epoch, time, metric, value FROM steps "
        "WHERE run = ? AND metric IS NOT NULL ORDER BY rank, step, seq, metric) "
        f"TO '{target}' ({options})",
        [run],
    ).fetchone()
    return int(row[0]) if row else 0


class Reads:
    """The Store's read methods (any thread): in-memory summaries under the state lock, SQL
    on a pooled cursor. Store (db.py) sets the attributes."""

    path: Path
    _con: duckdb.DuckDBPyConnection
    _reads: Cursors
    _state_lock: threading.Lock
    _mirror: Mirror
    _closed: bool
    _gate: openbuckets.Gate
    _incident_memo: stored_incidents.Memo

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self.path} is closed")

    def _query(self) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        self._check_open()
        return self._reads.cursor()

    def runs(self) -> list[dict[str, Any]]:
        with self._state_lock:
            return self._mirror.runs()

    def metrics(self, run: str) -> list[str]:
        with self._state_lock:
            return sorted(s.metric for s in self._mirror.metric_stats(run))

    def ranks(self, run: str) -> list[dict[str, Any]]:
        """Per-rank summary (host, pid, world_size, times, records, last_step, ended)."""
        with self._state_lock:
            rows = self._mirror.ranks.get(run, {})
            return [rows[rank].as_dict() for rank in sorted(rows)]

    def events(self, run: str) -> list[dict[str, Any]]:
        with self._query() as cur:
            return events(cur, run)

    def rank_columns(self, run: str) -> dict[str, np.ndarray]:
        """``ranks()`` as columns in rank order (NULLs masked), with each rank's last start,
        end or crash event (``life``): a run of 100,000 ranks without a dict per rank."""
        with self._query() as cur:
            return lives.rank_columns(cur, run)

    def rank_lives(self, run: str) -> list[tuple[bool, str | None, int]]:
        """(ended, last start/end/crash event, ranks) of ``run``: its ranks counted by what
        their final state is made of, in the order of each kind's first rank."""
        with self._query() as cur:
            return lives.rank_lives(cur, run)

    def incidents(self, run: str) -> list[dict[str, Any]]:
        """The latest judgement of every incident of ``run`` the store holds, oldest first."""
        self._check_open()

        def fetch() -> list[dict[str, Any]]:
            with self._query() as cur:
                return stored_incidents.read(cur, run)

        return self._incident_memo.read(run, fetch)

    def commands(self, run: str | None, since: float = 0.0) -> list[dict[str, Any]]:
        """Every stored command of ``run`` (None: of every run) changed since ``since``, with
        its latest answers, oldest first."""
        with self._query() as cur:
            return stored_commands.read(cur, run, since)

    def stacks(self, run: str) -> dict[int, dict[str, Any]]:
        """Rank -> the latest stack sample the store holds for it (the wire form)."""
        with self._query() as cur:
            return stored_stacks.read(cur, run)

    def heartbeats(self, run: str) -> list[dict[str, Any]]:
        """The latest heartbeat of each rank of ``run``."""
        with self._query() as cur:
            return heartbeats(cur, run)

    def seen_seqs(self) -> list[tuple[str, int, int, int, int]]:
        """Every flushed (run, rank, inc, seq) as merged inclusive intervals
        (run, rank, inc, lo, hi)."""
        self._check_open()
        with self._state_lock:
            held = self._mirror.seen
        return held.rows()

    def records(self, run: str) -> Iterator[Record]:
        """Every stored record of ``run`` rebuilt as a dataclass, ordered by (rank, seq)."""
        self._check_open()
        return read_records(self._con, run)

    def series(
        self,
        run: str,
        metric: str,
        ranks: Sequence[int] | None = None,
        start: int | None = None,
        end: int | None = None,
        max_points: int = 2000,
    ) -> dict[int, dict[str, list]]:
        """rank -> {"step", "value", "min", "max"}: at most ``max_points`` per rank; downsampled
        ranges draw each bucket's minimum and maximum at their own steps (spikes survive).
        ``series_columns`` is the same as numpy arrays, without building Python lists."""
        return self.series_columns(run, metric, ranks, start, end, max_points).to_lists()

    def series_columns(
        self,
        run: str,
        metric: str,
        ranks: Sequence[int] | None = None,
        start: int | None = None,
        end: int | None = None,
        max_points: int = 2000,
    ) -> SeriesColumns:
        """The points of ``series()``, every rank concatenated in rank order (columns.py)."""
        plan = self._plan(run, metric, ranks, start, end, max_points, 2)
        if plan is None:
            return SeriesColumns.empty()
        with self._gate.shared():  # the open buckets and the closed rows of one flush
            with self._state_lock:
                held = self._mirror.opens
            opens = [held.rows(i, run, metric, ranks) for i in range(len(rollup.LEVELS))]
            with self._query() as cur:
                return series_columns(cur, plan, max_points, opens)

    def band(
        self,
        run: str,
        metric: str,
        start: int | None = None,
        end: int | None = None,
        max_points: int = 2000,
    ) -> dict[str, list]:
        """Cross-rank {"step", "median", "p5", "p95", "min", "max"} over finite values; a
        downsampled point is a bucket: mean of medians, lowest p5/min, highest p95/max.
        ``band_columns`` is the same as numpy arrays."""
        return columns.band_lists(self.band_columns(run, metric, start, end, max_points))

    def band_columns(
        self,
        run: str,
        metric: str,
        start: int | None = None,
        end: int | None = None,
        max_points: int = 2000,
    ) -> dict[str, np.ndarray]:
        """``band()`` as arrays: "step" int64, the statistics float64 (NaN: no finite value)."""
        plan = self._plan(run, metric, None, start, end, max_points, 1)
        if plan is None:
            return columns.empty_band()
        with self._state_lock:
            done = self._mirror.band.get(run)
        with self._query() as cur:
            return band_columns(cur, plan, done, max_points)

    def latest_values(
        self, run: str, metric: str, window: int = LATEST_WINDOW_STEPS
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each rank's value of ``metric`` at its newest stored step, among the run's last
        ``window`` steps of it: (ranks int64, values float64), in rank order."""
        self._check_open()
        with self._state_lock:
            stats = self._mirror.stats.get((run, metric))
        if stats is None:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        with self._query() as cur:
            return latest_values(cur, run, metric, stats.hi - window + 1)

    def _plan(
        self,
        run: str,
        metric: str,
        ranks: Sequence[int] | None,
        start: int | None,
        end: int | None,
        max_points: int,
        points_per_bucket: int,
    ) -> Plan | None:
        self._check_open()
        with self._state_lock:
            stats = self._mirror.stats.get((run, metric))
        return plan(run, metric, stats, ranks, start, end, max_points, points_per_bucket)

    def export_steps(self, run: str, out_path: Path, fmt: str) -> int:
        """COPY the long step rows of ``run`` to CSV or Parquet (export.py checks the
        arguments); returns the number of rows written."""
        with self._query() as cur:
            return export_steps(cur, run, out_path, fmt)
