"""The history store: every accepted record on disk (DuckDB), behind a narrow interface.

``append`` only buffers (any thread); ``flush`` writes the buffer in one transaction of bulk
inserts from Arrow tables and updates the rollups (``rollup.py``) and the cross-rank band in the
same transaction, so a ``kill -9`` leaves either all of a flush or none of it (DuckDB's WAL).
Queries use one DuckDB cursor per thread and see committed flushes only. See docs/storage.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import duckdb
import numpy as np
from rankwatch.agent.wire.records import Record, StepBlock, StepRecord
from rankwatch.aggregator.store import columns, rollup
from rankwatch.aggregator.store.buffer import Batch, Item
from rankwatch.aggregator.store.buffer import columns as buffer_columns
from rankwatch.aggregator.store.columns import SeriesColumns
from rankwatch.aggregator.store.rows import (
    ADD_INC,
    BUFFERED,
    META_BATCH,
    NULL_CODE,
    RANK_BATCH,
    RANK_FIELDS,
    SEQ_MERGE,
    TABLES,
    Mirror,
    read_records,
    select_sql,
)

STORE_FILENAME = "store.duckdb"  # inside the data dir when Store is given a directory
SCHEMA_VERSION = 2  # 2: the band's rollups in two rows per bucket
MEMORY_LIMIT = "512MB"  # DuckDB's buffer pool; keeps the aggregator well under 1 GB RSS
MAX_BUFFER_ROWS = 5_000_000  # rows held in memory while the disk refuses them (~400 MB)
BAND_STALE_S = 30.0  # a rank without a step record this long no longer holds back the band
BAND_WAIT_UNSEEN_S = 60.0  # ranks of world_size never seen hold it back this long
BAND_REPAIR_QUIET_S = 10.0  # a run with late rows is re-banded after this long without input
BAND_REPAIR_ROWS = 200_000  # ... or at once if re-banding reads fewer raw rows than this
NO_STEP = rollup.NO_STEP
# a flush's names as an SQL list (temp table buf_names): a code c is _NAMES[c + 1]
_NAMES = "(SELECT names FROM buf_names)"


class StoreError(RuntimeError):
    """The store cannot be opened or written (not writable, disk full, locked by another
    process). Unflushed records stay buffered in memory; nothing already stored is harmed."""


class Store:
    """DuckDB-backed history of every accepted record; see the module docstring."""

    def __init__(
        self,
        path: Path | str,
        *,
        memory_limit: str = MEMORY_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        path = Path(path)
        if path.suffix not in (".duckdb", ".db"):
            path = path / STORE_FILENAME
        self.path = path
        self._clock = clock
        _warm_up_duckdb()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(str(path), config=_config(memory_limit))
        except (OSError, duckdb.Error) as exc:
            raise StoreError(f"cannot open the store at {path}: {exc}") from exc
        self._writer = self._con.cursor()
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = [self._writer]
        self._buf_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._buf = Batch()
        self._closed = False
        # clock() of the last append per run and rank (this process only): the band frontier
        self._arrival: dict[str, dict[int, float]] = {}
        self._run_first: dict[str, float] = {}
        try:
            self._create()
            self._mirror = Mirror.load(self._writer)
            # the flush's numpy columns are found by name in the frame that made them, also
            # when rollup.run_script executes the statement one frame down: see _insert_batch
            self._writer.execute("SET python_scan_all_frames = true")
        except (duckdb.Error, StoreError) as exc:
            self._con.close()
            raise StoreError(f"cannot read the store at {path}: {exc}") from exc

    def _create(self) -> None:
        cur = self._writer
        for spec in TABLES:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {spec}")
        cur.execute(ADD_INC)
        rollup.create_tables(cur)
        row = cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            cur.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        elif int(row[0]) > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema {row[0]}, newer than {SCHEMA_VERSION}")
        elif int(row[0]) < SCHEMA_VERSION:
            self._upgrade(int(row[0]))

    def _upgrade(self, version: int) -> None:
        """Bring a store an earlier version wrote up to SCHEMA_VERSION, in one transaction."""
        cur = self._writer
        script = ["BEGIN TRANSACTION"]
        if version < 2:
            # v2: the band's rollups keep two rows per bucket (rollup.band_part_sql), not one
            # per statistic; they are folded again from the band's rows
            script += [
                *(f"DELETE FROM {rollup.table('band', w, o)}" for w in rollup.LEVELS
                  for o in (False, True)),
                "CREATE OR REPLACE TEMP TABLE rw_band AS SELECT * FROM band",
            ]  # fmt: skip
            part = rollup.band_part_sql("rw_band", rollup.LEVELS[0])
            script = rollup.fold(cur, "band", part, script)
        rollup.run_script(cur, [
            *script,
            f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'",
            "COMMIT",
        ])  # fmt: skip

    # --- writing ---------------------------------------------------------------------------

    def append(self, records: Sequence[Item]) -> None:
        """Buffer accepted records and ``StepBlock``s (cheap; any thread). They reach disk at
        the next flush(); a block is stored exactly as its ``records()`` would be."""
        self._check_open()
        now = self._clock()
        with self._buf_lock:
            self._buf.extend(records)  # checks the types first
            # Only step records count as arrival for the band: a hung rank goes on sending
            # heartbeats, and must not hold every later step's band back (unsettled steps are
            # banded from raw rows at each query: a chart would grow slower with every step).
            senders = {(rec.run, rec.rank, _has_steps(rec)) for rec in records}
            for run, rank, stepped in senders:
                runs = self._arrival.get(run)
                if runs is None:
                    runs = self._arrival[run] = {}
                    self._run_first[run] = now
                if stepped:
                    runs[rank] = now

    def append_steps(
        self,
        run: str,
        metric: str,
        rank: np.ndarray,
        step: np.ndarray,
        value: np.ndarray,
        *,
        seq: np.ndarray | None = None,
        time_s: np.ndarray | None = None,
        world_size: int = 1,
    ) -> None:
        """Bulk path (benchmarks, importers): one step record per array element, one metric.

        ``seq`` defaults to ``step + 1`` (a record per step per rank), ``time_s`` to 0.
        """
        self._check_open()
        rank = np.asarray(rank, dtype=np.int32)
        step = np.asarray(step, dtype=np.int64)
        seq = step + 1 if seq is None else np.asarray(seq, dtype=np.int64)
        t = np.zeros(len(step)) if time_s is None else np.asarray(time_s, dtype=np.float64)
        now = self._clock()
        with self._buf_lock:
            self._buf.add_columns(
                run, metric, rank, step, np.asarray(value, np.float64), seq, t, world_size
            )
            self._run_first.setdefault(run, now)
            runs = self._arrival.setdefault(run, {})
            for r in np.unique(rank).tolist():
                runs[r] = now

    def pending(self) -> int:
        """Records appended and not flushed yet. Counted outside the lock that ``append``
        (the ingest thread) needs: only the lists are copied under it (300,000 buffered
        records: 2 ms to copy, 8 ms to count)."""
        held = Batch()
        with self._buf_lock:
            held.records, held.parts = list(self._buf.records), list(self._buf.parts)
        return held.count()

    def flush(self) -> None:
        """Write everything buffered; raises StoreError and keeps the records buffered (up to
        MAX_BUFFER_ROWS) when the disk refuses them.

        One transaction per flush, unless DuckDB runs out of memory (a big backlog after an
        outage, thousands of series at once): then the batch is written in halves, and halves
        of those, oldest first, so a backlog that fits nowhere at once still gets stored."""
        self._check_open()
        with self._flush_lock:
            with self._buf_lock:
                batch, self._buf = self._buf, Batch()
            pending = [batch]
            while pending:
                part = pending.pop(0)
                try:
                    self._write(part)
                except duckdb.OutOfMemoryException as exc:
                    halves = part.split()
                    if halves is not None:
                        pending[:0] = halves
                        continue
                    self._fail([part, *pending], exc)
                except (duckdb.Error, OSError) as exc:
                    self._fail([part, *pending], exc)

    def _fail(self, unwritten: list[Batch], exc: Exception) -> NoReturn:
        """Put what was not written back in front of the buffer, and raise."""
        rest = unwritten[0]
        for later in unwritten[1:]:
            rest.absorb(later, math.inf)
        with self._buf_lock:
            dropped = rest.absorb(self._buf, MAX_BUFFER_ROWS)
            self._buf = rest
        more = f"; {dropped} oldest buffered rows dropped" if dropped else ""
        raise StoreError(f"cannot write to the store at {self.path}: {exc}{more}") from exc

    def _write(self, batch: Batch) -> None:
        cur = self._writer
        now = self._clock()
        with self._state_lock:
            mirror = self._mirror.copy()
        with self._buf_lock:
            arrival = {run: dict(ranks) for run, ranks in self._arrival.items()}
        part = None if batch.empty else batch.to_numpy()
        raw = {} if part is None else {n: c for n, c in part.tables.items() if len(c["seq"])}
        if raw:
            raw["names"] = _names_columns(part.names)  # type: ignore[union-attr]
        # Statements go to DuckDB joined, a few calls per flush (rollup.query says why).
        script = ["BEGIN TRANSACTION"]
        try:
            if "recs" in raw:
                script = self._insert_batch(cur, mirror, script, raw)
            script = rollup.settle_bands(
                cur, mirror, arrival, self._run_first, now, stale_s=BAND_STALE_S,
                wait_unseen_s=BAND_WAIT_UNSEEN_S, repair_quiet_s=BAND_REPAIR_QUIET_S,
                repair_rows=BAND_REPAIR_ROWS, script=script,
            )  # fmt: skip
            rollup.run_script(cur, [*script, "COMMIT"])
        except BaseException:
            # the transaction may already be gone; the original error is what matters
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            raise
        with self._state_lock:
            self._mirror = mirror

    def _insert_batch(
        self,
        cur: duckdb.DuckDBPyConnection,
        mirror: Mirror,
        script: list[str],
        raw: dict[str, dict[str, np.ndarray]],
    ) -> list[str]:
        script = [
            *script,
            "CREATE OR REPLACE TEMP TABLE buf_recs AS " + select_sql("recs", "raw_recs"),
            *(f"INSERT INTO {n} " + select_sql(n, f"raw_{n}") for n in ("events", "heartbeats")
              if n in raw),
            SEQ_MERGE,
            "DELETE FROM seqs USING (SELECT DISTINCT run, rank FROM rw_seq) k "
            "WHERE seqs.run = k.run AND seqs.rank = k.rank",
            "INSERT INTO seqs SELECT * FROM rw_seq",
        ]  # fmt: skip
        # buf_steps keeps run and metric as int codes: the statistics and the finest rollup
        # group the codes and look the names up per group, not per row.
        if "steps" in raw:
            script += [
                "CREATE OR REPLACE TEMP TABLE buf_names AS "
                "SELECT list(CAST(name AS VARCHAR) ORDER BY i) AS names FROM raw_names",
                "CREATE OR REPLACE TEMP TABLE buf_steps AS SELECT * FROM raw_steps",
                "INSERT INTO steps " + select_sql("steps", "buf_steps"),
            ]
        # what the bookkeeping needs back, in one row: lists of structs
        stats = (
            f"SELECT {_NAMES}[run + 1], {_NAMES}[metric + 1], n, lo, hi, ranks FROM ("
            "SELECT run, metric, count(*) AS n, min(step) AS lo, max(step) AS hi, "
            f"list(DISTINCT rank) AS ranks FROM buf_steps WHERE metric <> {NULL_CODE} "
            "GROUP BY run, metric)"
            if "steps" in raw
            else "SELECT NULL WHERE false"
        )
        lists = ", ".join(
            f"(SELECT list(t{order}) FROM ({q}) t)"
            for q, order in ((META_BATCH, " ORDER BY t.run, t.rank, t.seq"), (RANK_BATCH, ""),
                             (stats, ""))
        )  # fmt: skip
        # DuckDB finds the numpy columns by their names in this frame (a replacement scan), so
        # no register()/unregister(): each of those is a GIL hand-over (~20 ms each with the
        # ingest thread busy). Later statements read the buf_ tables.
        raw_names, raw_recs = raw["names"], raw["recs"]
        raw_steps, raw_events, raw_heartbeats = (raw.get(n) for n in BUFFERED[:3])
        sql = ";\n".join([*script, "SELECT " + lists])
        ((meta_rows, rank_rows, stat_rows),) = cur.execute(sql).fetchall()
        del raw_names, raw_recs, raw_steps, raw_events, raw_heartbeats
        meta, prev = [], None
        for row in map(_values, meta_rows or []):
            key, ident = row[:2], row[3:]
            known = prev[3:] if prev is not None and prev[:2] == key else mirror.identity(*key)
            if ident != known:
                meta.append(row)
            prev = row
        if meta:
            cur.executemany("INSERT INTO rank_meta VALUES (?, ?, ?, ?, ?, ?, ?)", meta)
        changed = mirror.merge_ranks([_values(r) for r in rank_rows or []])
        if changed:
            # As columns found by name, like raw_recs: an SQL VALUES list of 4,096 ranks took
            # ~0.3 s to parse, twice per flush.
            rank_names: dict[str, int] = {}
            cols = [[getattr(r, f) for r in changed] for f in RANK_FIELDS]
            raw_ranks = buffer_columns("ranks", cols, rank_names)
            raw_rank_names = _names_columns(list(rank_names))
            rollup.run_script(cur, [
                "CREATE OR REPLACE TEMP TABLE rw_ranks AS "
                + select_sql("ranks", "raw_ranks", "raw_rank_names"),
                "DELETE FROM ranks USING rw_ranks k "
                "WHERE ranks.run = k.run AND ranks.rank = k.rank",
                "INSERT INTO ranks SELECT * FROM rw_ranks",
            ])  # fmt: skip
            del raw_ranks, raw_rank_names
        script = []
        if "steps" not in raw:
            return script
        stats = [_values(r) for r in stat_rows or []]
        mirror.merge_metrics(stats)
        # Values for steps whose band is already settled: the band misses them until repaired.
        # (A metric's first step in this flush is its earliest late step, if any is late.)
        for run, metric, _, lo, _, _ in stats:
            if run in mirror.band and lo <= mirror.band[run]:
                key = (run, metric)
                mirror.late[key] = min(lo, mirror.late.get(key, lo))
                where = f"run = {rollup.literal(run)} AND metric = {rollup.literal(metric)}"
                script += [
                    f"DELETE FROM band_late WHERE {where}",
                    f"INSERT INTO band_late VALUES ({rollup.literal(run)}, "
                    f"{rollup.literal(metric)}, {mirror.late[key]})",
                ]
        source = (
            "SELECT run, metric, CAST(rank AS INTEGER) AS key, step, "
            f"coalesce(value, 'nan'::DOUBLE) AS value FROM buf_steps WHERE metric <> {NULL_CODE}"
        )
        return rollup.fold(cur, "series", rollup.raw_part(source, _NAMES), script)

    def rebuild_band(self, run: str) -> None:
        """Recompute the band of ``run`` from its raw rows at the next flush (after an import
        that delivered ranks one after the other)."""
        with self._state_lock:
            if self._mirror.band.get(run, NO_STEP) > NO_STEP:
                for stats in self._mirror.metric_stats(run):
                    self._mirror.late[(run, stats.metric)] = stats.lo
        with self._buf_lock:
            ranks = self._arrival.get(run, {})
            for rank in ranks:
                ranks[rank] = -math.inf
        self.flush()

    def close(self) -> None:
        """Flush and close (idempotent). Raises StoreError if the final flush fails."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            for cur in self._cursors:
                cur.close()
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store at {self.path} is closed")

    def _cur(self) -> duckdb.DuckDBPyConnection:
        self._check_open()
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self._con.cursor()
            with self._state_lock:
                self._cursors.append(cur)
        return cur

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
        rows = self._cur().execute(
            "SELECT run, rank, seq, time, world_size, host, pid, event, step, info FROM events "
            "WHERE run = ? ORDER BY time, rank, seq",
            [run],
        )
        names = [d[0] for d in rows.description]
        out = [dict(zip(names, row, strict=True)) for row in rows.fetchall()]
        for ev in out:
            ev["info"] = json.loads(ev["info"])
        return out

    def heartbeats(self, run: str) -> list[dict[str, Any]]:
        """The latest heartbeat of each rank of ``run``."""
        rows = self._cur().execute(
            "SELECT run, rank, arg_max(seq, seq) AS seq, arg_max(time, seq) AS time, "
            "arg_max(last_step, seq) AS last_step, arg_max(next_in, seq) AS next_in, "
            "arg_max(dropped, seq) AS dropped, arg_max(paused, seq) AS paused, count(*) AS count "
            "FROM heartbeats WHERE run = ? GROUP BY run, rank ORDER BY rank",
            [run],
        )
        names = [d[0] for d in rows.description]
        return [dict(zip(names, row, strict=True)) for row in rows.fetchall()]

    def seen_seqs(self) -> list[tuple[str, int, int, int, int]]:
        """Every flushed (run, rank, inc, seq) as merged inclusive intervals
        (run, rank, inc, lo, hi)."""
        return (
            self._cur()
            .execute("SELECT run, rank, inc, lo, hi FROM seqs ORDER BY run, rank, inc, lo")
            .fetchall()
        )

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
        level, lo, hi, where, params = plan
        cur = self._cur()
        # cur.sql(): DuckDB's relation path converts to numpy about twice as fast as
        # execute()'s result (measured, bench/overlay_query.py), and the conversion is most
        # of a big overlay's query time.
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
            # no ``b`` column: a bucket's minimum's step orders buckets just as well
            res = rollup.sort_buckets(
                cur.sql(
                    "SELECT key, mn, mn_step, mx, mx_step FROM ("
                    + rollup.bucket_sql("series", level, where, lo // width, hi // width)
                    + ")",
                    params=params,
                ).fetchnumpy(),
                "mn_step",
            )
            out = columns.bucket_columns(
                res["key"], res["mn"], res["mn_step"], res["mx"], res["mx_step"], lo, hi
            )
        return columns.minmax_reduce(out, max_points)

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
        level, lo, hi, where, params = plan
        with self._state_lock:
            done = self._mirror.band.get(run, NO_STEP)
        params = {**params, "lo": lo, "hi": hi, "done": done}
        tail = rollup.band_wide_sql(
            "run = $run AND metric = $metric AND step > $done AND step BETWEEN $lo AND $hi"
        )
        if level < 0:
            sql = (
                "SELECT step, median, p5, p95, vmin, vmax FROM band WHERE run = $run AND "
                "metric = $metric AND step <= $done AND step BETWEEN $lo AND $hi UNION ALL "
                f"SELECT step, median, p5, p95, vmin, vmax FROM ({tail}) ORDER BY step"
            )
        else:
            width = rollup.LEVELS[level]
            tail_buckets = f"WITH w AS MATERIALIZED ({tail}) " + rollup.band_part_sql("w", width)
            sql = rollup.band_pivot_sql(
                rollup.bucket_sql("band", level, where, lo // width, hi // width, tail_buckets)
            )
        res = self._cur().sql(sql, params=params).fetchnumpy()
        out = {"step": np.asarray(res["step"]).astype(np.int64)}
        for name, col in zip(columns.BAND_KEYS[1:], rollup.BAND_COLUMNS, strict=True):
            out[name] = np.ma.filled(np.ma.asarray(res[col], dtype=np.float64), math.nan)
        return columns.band_reduce(out, max_points)

    def _plan(
        self,
        run: str,
        metric: str,
        ranks: Sequence[int] | None,
        start: int | None,
        end: int | None,
        max_points: int,
        points_per_bucket: int,
    ) -> tuple[int, int, int, str, dict[str, Any]] | None:
        """Level, step range, WHERE clause and parameters for a query, or None if empty."""
        self._check_open()
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        with self._state_lock:
            stats = self._mirror.stats.get((run, metric))
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

    def export_steps(self, run: str, out_path: Path, fmt: str) -> int:
        """COPY the long step rows of ``run`` to CSV or Parquet (export.py checks the
        arguments); returns the number of rows written."""
        options = "FORMAT CSV, HEADER" if fmt == "csv" else "FORMAT PARQUET"
        target = str(out_path).replace("'", "''")
        row = (
            self._cur()
            .execute(
                "COPY (SELECT run, rank, step, epoch, time, metric, value FROM steps "
                "WHERE run = ? AND metric IS NOT NULL ORDER BY rank, step, seq, metric) "
                f"TO '{target}' ({options})",
                [run],
            )
            .fetchone()
        )
        return int(row[0]) if row else 0


def _config(memory_limit: str) -> dict[str, Any]:
    # Insertion order is not kept: every read that needs an order sorts (ORDER BY, or
    # rollup.sort_buckets), and without it DuckDB writes a flush's rows in parallel
    # (bench/ingest.py: the flush after the last record -15 %, stored/s +10 %).
    return {"memory_limit": memory_limit, "preserve_insertion_order": False}


def _has_steps(item: Item) -> bool:
    return type(item) is StepRecord or (type(item) is StepBlock and len(item) > 0)


def _values(row: dict[str, Any]) -> tuple:
    """A row fetched as a struct (dict) back as a tuple."""
    return tuple(row.values())


def _names_columns(names: list[str]) -> dict[str, np.ndarray]:
    """The name table of a part's coded columns (select_sql)."""
    return {"i": np.arange(len(names), dtype=np.int32), "name": np.array(names, dtype=object)}


_warmed = threading.Lock()
_warm = False


def _warm_up_duckdb() -> None:
    """Run DuckDB's first numpy fetch once, in one thread.

    DuckDB 2.0 can deadlock when two threads make a process's first ``fetchnumpy`` at the same
    time (seen: 7 hangs in 15 runs with 4 threads; none in 20 after this warm-up). The dashboard
    queries from several threads as soon as a page opens.
    """
    global _warm
    with _warmed:
        if not _warm:
            con = duckdb.connect()
            try:
                con.execute("SELECT 1::DOUBLE AS v").fetchnumpy()
                con.sql("SELECT 1::DOUBLE AS v").fetchnumpy()  # the read path's way
            finally:
                con.close()
            _warm = True
