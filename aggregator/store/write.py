"""The store's write path: one flush's batch into the tables, in one transaction.

The batch's numpy columns are scanned by DuckDB where they lie (found by name), the
bookkeeping (rank summaries, rank_meta) is done in SQL over the batch, the seq intervals are
merged in memory and logged (``seen.py``), and the
series rollups are folded in (``rollup.fold``). The band settles in its own
transaction after this one (``band.py``): a band that cannot be settled never keeps records
from being stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
from rankwatch.aggregator.store import openbuckets, rollup, seen, telemetry
from rankwatch.aggregator.store.buffer import Batch
from rankwatch.aggregator.store.parts import columns as buffer_columns
from rankwatch.aggregator.store.rows import (
    BUFFERED,
    META_BATCH,
    NULL_CODE,
    RANK_BATCH,
    Mirror,
    select_sql,
)

# a flush's names as an SQL list (temp table buf_names): a code c is _NAMES[c + 1]
_NAMES = "(SELECT names FROM buf_names)"


def insert(
    cur: duckdb.DuckDBPyConnection,
    mirror: Mirror,
    batch: Batch,
    commit: Callable[[list[str]], None],
) -> None:
    """Write ``batch`` on the writer cursor in one transaction and fold it into ``mirror``
    (a copy): all of it or, on an error, none. ``commit`` runs the last statements with the
    COMMIT and swaps ``mirror`` in (the caller's, so readers never see one without the
    other)."""
    if batch.empty:
        return
    part = batch.to_numpy()
    raw = {n: c for n, c in part.tables.items() if len(c["seq"])}
    if "recs" not in raw:
        return
    raw["names"] = names_columns(part.names)
    try:
        script = _insert_batch(cur, mirror, ["BEGIN TRANSACTION"], raw, part.names)
        commit(script)
    except BaseException:
        rollback(cur)
        raise


def rollback(cur: duckdb.DuckDBPyConnection) -> None:
    # the transaction may already be gone; the original error is what matters
    with contextlib.suppress(duckdb.Error):
        cur.execute("ROLLBACK")


def _insert_batch(
    cur: duckdb.DuckDBPyConnection,
    mirror: Mirror,
    script: list[str],
    raw: dict[str, dict[str, np.ndarray]],
    names: list[str],
) -> list[str]:
    script = [
        *script,
        "CREATE OR REPLACE TEMP TABLE buf_recs AS " + select_sql("recs", "raw_recs"),
        *(f"INSERT INTO {n} " + select_sql(n, f"raw_{n}") for n in ("events", "heartbeats")
          if n in raw),
        *(f"CREATE OR REPLACE TEMP TABLE {t} AS " + select_sql(n, f"raw_{n}")
          for n, t in (("telemetry", "buf_tel"), ("telemetry_labels", "buf_tlab")) if n in raw),
    ]  # fmt: skip
    # The seq intervals are merged in memory (seen.py); the table logs each flush's spans
    # (merged among themselves), rewritten merged once it holds twice as many rows.
    new = seen.batch(mirror.seen, names, raw["recs"])
    after = mirror.seen.added(new, mirror.seen.logged + len(new[0]))
    if after.compact_due():
        raw_seq = seen.columns(after)
        script += seen.compact_sql("raw_seq")
        after = dataclasses.replace(after, logged=len(after))
    else:
        raw_seq = seen.columns(after, new, names)
        script.append(seen.CODED_INSERT_SQL.format(src="raw_seq", names="raw_names"))
    mirror.seen = after
    # buf_steps keeps run and metric as int codes: the statistics and the finest rollup
    # group the codes and look the names up per group, not per row.
    if "steps" in raw:
        pairs, global_pairs = _pairs(raw["steps"], names, mirror.opens)
        script += [
            "CREATE OR REPLACE TEMP TABLE buf_names AS "
            "SELECT list(CAST(name AS VARCHAR) ORDER BY i) AS names FROM raw_names",
            "CREATE OR REPLACE TEMP TABLE buf_steps AS SELECT * FROM raw_steps",
            "INSERT INTO steps " + select_sql("steps", "buf_steps"),
        ]
    # New identities go to the rank_meta log in SQL (META_BATCH compares them with the ranks
    # table), and the flush's (run, metric) statistics to a temp table read after the script:
    # what comes back from the script is a row per rank, fetched as numpy columns (converting
    # thousands of rows into Python structs was most of a flush's cost per rank).
    script.append(f"INSERT INTO rank_meta {META_BATCH}")
    if "steps" in raw:
        script.append(
            f"CREATE OR REPLACE TEMP TABLE rw_stats AS SELECT {_NAMES}[run + 1], "
            f"{_NAMES}[metric + 1], n, lo, hi, ranks FROM (SELECT run, metric, count(*) AS n, "
            "min(step) AS lo, max(step) AS hi, list(DISTINCT rank) AS ranks FROM buf_steps "
            f"WHERE metric <> {NULL_CODE} GROUP BY run, metric)"
        )
    # DuckDB finds the numpy columns by their names in this frame (a replacement scan), so
    # no register()/unregister(): each of those is a GIL hand-over, slow with the ingest thread
    # busy (docs/benchmarks.md, figures behind choices). Later statements read the buf_ tables.
    raw_names, raw_recs = raw["names"], raw["recs"]
    raw_steps, raw_events, raw_heartbeats = (raw.get(n) for n in BUFFERED[:3])
    raw_telemetry, raw_telemetry_labels = raw.get("telemetry"), raw.get("telemetry_labels")
    rank_rows = _numpy_rows(cur.execute(";\n".join([*script, RANK_BATCH])).fetchnumpy())
    del raw_names, raw_recs, raw_steps, raw_events, raw_heartbeats, raw_seq
    if raw_telemetry is not None:
        telemetry.write(cur, mirror.tele, mirror.tele_done, raw_telemetry_labels is not None)
    del raw_telemetry, raw_telemetry_labels
    changed = mirror.merge_ranks(rank_rows)
    if changed:
        # As columns found by name, like raw_recs: an SQL VALUES list of thousands of ranks is
        # slow to parse, and it would be parsed twice per flush (docs/benchmarks.md).
        rank_names: dict[str, int] = {}
        rank_cols = list(zip(*changed, strict=True))  # RankRow: the table's columns, in order
        raw_ranks = buffer_columns("ranks", rank_cols, rank_names)
        raw_rank_names = names_columns(list(rank_names))
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
    ((stat_rows,),) = cur.execute("SELECT list(t) FROM rw_stats t").fetchall()
    stats = [_values(r) for r in stat_rows or []]
    mirror.merge_metrics(stats)
    # Values for steps whose band is already settled: the band misses them until repaired.
    # (A metric's first step in this flush is its earliest late step, if any is late.)
    late = []
    raw_late: dict[str, np.ndarray] = {}
    for run, metric, _, lo, _, _ in stats:
        if run in mirror.band and lo <= mirror.band[run]:
            key = (run, metric)
            mirror.late[key] = min(lo, mirror.late.get(key, lo))
            late.append((run, metric, mirror.late[key]))
    if late:  # found by name while rollup.fold runs the script below
        raw_late = {
            "run": np.array([r for r, _, _ in late], dtype=object),
            "metric": np.array([m for _, m, _ in late], dtype=object),
            "step": np.array([q for _, _, q in late], dtype=np.int64),
        }
        script += [
            "CREATE OR REPLACE TEMP TABLE rw_late_new AS SELECT CAST(run AS VARCHAR) AS run, "
            "CAST(metric AS VARCHAR) AS metric, step FROM raw_late",
            "DELETE FROM band_late t USING rw_late_new n WHERE t.run = n.run "
            "AND t.metric = n.metric",
            "INSERT INTO band_late SELECT * FROM rw_late_new",
        ]
    # The series' open buckets are in memory (openbuckets.py): grouped by the flush's (run, metric)
    # pairs, whose names are looked up only for the buckets that close.
    raw_pairs = pairs
    script += [
        "CREATE OR REPLACE TEMP TABLE buf_pairs AS SELECT "
        f"list({_NAMES}[run + 1] ORDER BY i) AS runs, "
        f"list({_NAMES}[metric + 1] ORDER BY i) AS metrics FROM raw_pairs",
    ]
    if mirror.opens.saved:  # the open tables on disk go stale from this commit on
        script += openbuckets.mark_sql("live")
    b = f"step // {rollup.LEVELS[0]}"
    part = (
        f"SELECT pair, key, {b} AS b, {rollup.RAW_AGG} FROM (SELECT pair, CAST(rank AS INTEGER) "
        f"AS key, step, coalesce(value, 'nan'::DOUBLE) AS value FROM buf_steps "
        f"WHERE metric <> {NULL_CODE}) GROUP BY pair, key, {b}"
    )
    script, news = openbuckets.fold(cur, mirror.opens, global_pairs, part, script)
    mirror.opens = mirror.opens.replaced(news, saved=False)
    del raw_late, raw_pairs
    return script


def _pairs(
    steps: dict[str, np.ndarray], names: list[str], opens: openbuckets.OpenBuckets
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Number the (run, metric) pairs of a flush's step rows: each row's pair goes in the
    column ``pair`` of ``steps``; returns the pairs' name codes (ordered by ``i``) and their
    global codes (``opens.code``), sorted, the flush's number of a pair being its position."""
    run, metric = steps["run"], steps["metric"]
    valid = metric != NULL_CODE
    combined = run.astype(np.int64) * (len(names) + 1) + metric
    uniq, inverse = np.unique(np.where(valid, combined, -1), return_inverse=True)
    if len(uniq) and uniq[0] == -1:
        uniq, inverse = uniq[1:], inverse - 1
    runs, metrics = uniq // (len(names) + 1), uniq % (len(names) + 1)
    codes = np.array([opens.code(names[r], names[m]) for r, m in zip(runs.tolist(),
                      metrics.tolist(), strict=True)], dtype=np.int64)  # fmt: skip
    order = np.argsort(codes)
    position = np.full(max(1, len(order)), -1, np.int64)
    position[order] = np.arange(len(order))
    steps["pair"] = np.where(inverse >= 0, position[np.maximum(inverse, 0)], -1).astype(np.int32)
    raw_pairs = {
        "i": np.arange(len(order), dtype=np.int32),
        "run": runs[order].astype(np.int32),
        "metric": metrics[order].astype(np.int32),
    }
    return raw_pairs, codes[order]


def _numpy_rows(columns: dict[str, np.ndarray]) -> list[tuple]:
    """A result fetched as numpy columns back as rows (a NULL, masked, as None)."""
    return list(zip(*(col.tolist() for col in columns.values()), strict=True))


def _values(row: dict[str, Any]) -> tuple:
    """A row fetched as a struct (dict) back as a tuple."""
    return tuple(row.values())


def names_columns(names: list[str]) -> dict[str, np.ndarray]:
    """The name table of a part's coded columns (select_sql)."""
    return {"i": np.arange(len(names), dtype=np.int32), "name": np.array(names, dtype=object)}
