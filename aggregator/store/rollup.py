"""Multi-resolution rollups of long rows, maintained at ingest, read in proportion to the points.

A *source* is a stream of long rows ``(run, metric, key, step, value)``: for the per-rank series
``key`` is the rank. Each level groups steps into buckets ``b = step // width`` and keeps, per
``(run, metric, key, b)``: the count, the sum, the minimum and the maximum with the step where
each occurred, and the first and last step. The cross-rank band keeps two such rows per bucket
(``band_part_sql``).

Per level there are two tables: ``<src>_l<w>`` holds closed buckets and ``<src>_l<w>_open`` holds
at most one open (latest) bucket per key. A bucket closes as soon as a row of a later bucket of
the same key arrives (ranks report steps in order); its aggregate is then folded into the next
level, so a level only ever sees closed buckets of the level below. Rows that arrive late for a
closed bucket (a resend, a rank restarted from a checkpoint) are merged into it, so closed rows
stay unique per bucket and are read without aggregation. Reading level ``w`` means: closed rows
of ``w`` + the open rows of every level ``<= w`` re-bucketed to ``w`` (which never share a
bucket with a closed row). Everything happens inside the caller's transaction, so rollups can
never disagree with the raw rows after a crash.

Also here: the band's SQL (its rows per step and their buckets; which runs' bands settle and
when is ``band.py``) and level choice for a query; the numpy code turning bucket rows into the
points the dashboard draws is ``columns.py``. See docs/storage.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np

LEVELS: tuple[int, ...] = (16, 256, 4096)  # bucket widths in steps; each is FANOUT x the last
FANOUT = 16
SOURCES = ("series", "band")
FINE_READ_ROWS = 50_000  # rows a query may read beyond its points to use the whole budget
FINE_SCAN_ROWS = 4_000_000  # rows of all ranks a query for some ranks may scan at one level

COLUMNS = "run, metric, key, b, n, s, mn, mn_step, mx, mx_step, lo, hi"
_SCHEMA = (
    "run VARCHAR, metric VARCHAR, key INTEGER, b BIGINT, n BIGINT, s DOUBLE, mn DOUBLE, "
    "mn_step BIGINT, mx DOUBLE, mx_step BIGINT, lo BIGINT, hi BIGINT"
)
# Aggregate of raw long rows into buckets / of partial buckets into coarser ones. DuckDB orders
# NaN above every number, so a bucket holding a NaN reports it as its maximum: the NaN survives
# downsampling just like a spike does.
RAW_AGG = (
    "count(*) AS n, sum(value) AS s, min(value) AS mn, arg_min(step, value) AS mn_step, "
    "max(value) AS mx, arg_max(step, value) AS mx_step, min(step) AS lo, max(step) AS hi"
)
MERGE_AGG = (
    "sum(u.n) AS n, sum(u.s) AS s, min(u.mn) AS mn, arg_min(u.mn_step, u.mn) AS mn_step, "
    "max(u.mx) AS mx, arg_max(u.mx_step, u.mx) AS mx_step, min(u.lo) AS lo, max(u.hi) AS hi"
)


# Bucket rows scanned from numpy columns (the series' open buckets in memory, openbuckets.py):
# DuckDB reads NaN there as NULL, and a bucket's sum, minimum or maximum is NULL only so.
NUMPY_BUCKET = (
    "key, b, n, coalesce(s, 'nan'::DOUBLE) AS s, coalesce(mn, 'nan'::DOUBLE) AS mn, mn_step, "
    "coalesce(mx, 'nan'::DOUBLE) AS mx, mx_step, lo, hi"
)


def table(src: str, width: int, open_: bool = False) -> str:
    return f"{src}_l{width}" + ("_open" if open_ else "")


def create_tables(cur: duckdb.DuckDBPyConnection) -> None:
    for src in SOURCES:
        for width in LEVELS:
            for open_ in (False, True):
                cur.execute(f"CREATE TABLE IF NOT EXISTS {table(src, width, open_)} ({_SCHEMA})")


def raw_part(source_sql: str, names: str | None = None) -> str:
    """Long rows (``source_sql``: run, metric, key, step, value) as the finest level's buckets.

    ``names``: run and metric are int codes into this SQL list of names (the store's numpy
    buffer); they are grouped as ints and turned into names per bucket, not per row."""
    group = f"run, metric, key, step // {LEVELS[0]}"
    buckets = (
        f"SELECT {group} AS b, {RAW_AGG} FROM ({source_sql}) WHERE value IS NOT NULL "
        f"GROUP BY {group}"
    )
    if names is None:
        return buckets
    return (
        f"SELECT {names}[g.run + 1] AS run, {names}[g.metric + 1] AS metric, g.key, g.b, g.n, "
        f"g.s, g.mn, g.mn_step, g.mx, g.mx_step, g.lo, g.hi FROM ({buckets}) g"
    )


def fold(
    cur: duckdb.DuckDBPyConnection, src: str, part_sql: str, before: Sequence[str] = ()
) -> list[str]:
    """Fold new buckets of the finest level (``part_sql``, see ``raw_part``) into every level.

    Runs on the writer cursor inside the caller's transaction. Per level: one table of the
    merged buckets (the new part plus the keys' open rows), the open rows replaced, what
    closed counted, the closed rows inserted; the next level's part is a CTE over this level's
    closed rows, and a level nothing closed in ends the fold. Statements go to DuckDB in one
    call per level (see ``query``): ``before`` (the caller's) join the first, and the
    statements left after the last count are returned for the caller to run with its next.
    """
    key = "p.run = o.run AND p.metric = o.metric AND p.key = o.key"
    part = part_sql
    script = list(before)
    for i, width in enumerate(LEVELS):
        open_t, closed_t, comb = table(src, width, True), table(src, width), f"rw_comb{i}"
        # The latest bucket per key stays open; every earlier one is complete, or a late delta
        # for a bucket closed before (below the key's old open bucket).
        script += [
            f"""CREATE OR REPLACE TEMP TABLE {comb} AS
            WITH p AS MATERIALIZED ({part}),
            u AS (SELECT {COLUMNS}, false AS old FROM p
                  UNION ALL SELECT o.*, true FROM {open_t} o SEMI JOIN p ON {key}),
            g AS (SELECT u.run, u.metric, u.key, u.b, {MERGE_AGG}, bool_or(u.old) AS old
                  FROM u GROUP BY u.run, u.metric, u.key, u.b)
            SELECT {COLUMNS}, b = max(b) OVER k AS is_open,
                   coalesce(b < max(CASE WHEN old THEN b END) OVER k, false) AS late
            FROM g WINDOW k AS (PARTITION BY run, metric, key)""",
            f"DELETE FROM {open_t} o USING (SELECT DISTINCT run, metric, key FROM {comb}) p "
            f"WHERE {key}",
            f"INSERT INTO {open_t} SELECT {COLUMNS} FROM {comb} WHERE is_open",
        ]
        ((late, closed),) = query(
            cur,
            script,
            f"SELECT count(*) FILTER (WHERE late), count(*) FILTER (WHERE NOT is_open) FROM {comb}",
        )
        script = close_sql(comb, closed_t, COLUMNS, late, closed)
        if not closed or i + 1 == len(LEVELS):
            break
        # Deltas (not merged totals) go up, so a coarser bucket counts each row once.
        part = (
            f"SELECT u.run, u.metric, u.key, u.b // {FANOUT} AS b, {MERGE_AGG} FROM {comb} u "
            f"WHERE NOT u.is_open GROUP BY u.run, u.metric, u.key, u.b // {FANOUT}"
        )
    return script


def query(cur: duckdb.DuckDBPyConnection, script: Sequence[str], sql: str) -> list[tuple]:
    """Run ``script`` then ``sql`` in one call and return ``sql``'s rows.

    Why one call: while another Python thread is busy (the ingest thread), every DuckDB call
    waits for the GIL when it hands results back (and between its tasks), about a switch
    interval (``sys.getswitchinterval()``) each time; statements joined in one call pay that
    about a third as often (figures: docs/storage.md).
    """
    return cur.execute(";\n".join([*script, sql])).fetchall()


def run_script(cur: duckdb.DuckDBPyConnection, script: Sequence[str]) -> None:
    if script:
        cur.execute(";\n".join(script))


def literal(value: str) -> str:
    """``value`` as an SQL string literal (joined statements take no parameters)."""
    return "'" + value.replace("'", "''") + "'"


def close_sql(comb: str, closed_t: str, cols: str, late: int, closed: int) -> list[str]:
    """The statements that write a level's closed buckets from its merged table ``comb``
    (columns ``cols``): late deltas merged into the buckets closed before, the rest inserted."""
    script: list[str] = []
    if late:
        script += [
            f"CREATE OR REPLACE TEMP TABLE rw_late AS SELECT {cols} FROM {comb} WHERE late",
            *merge_late(closed_t),
        ]
    if closed > late:
        script.append(
            f"INSERT INTO {closed_t} SELECT {cols} FROM {comb} "
            "WHERE NOT is_open AND NOT late ORDER BY key, b"
        )
    return script


def merge_late(closed_t: str) -> list[str]:
    match = "c.run = l.run AND c.metric = l.metric AND c.key = l.key AND c.b = l.b"
    return [
        f"""CREATE OR REPLACE TEMP TABLE rw_merged AS
        SELECT u.run, u.metric, u.key, u.b, {MERGE_AGG} FROM (
            SELECT * FROM rw_late
            UNION ALL SELECT c.* FROM {closed_t} c SEMI JOIN rw_late l ON {match}
        ) u GROUP BY u.run, u.metric, u.key, u.b""",
        f"DELETE FROM {closed_t} c USING rw_late l WHERE {match}",
        f"INSERT INTO {closed_t} SELECT {COLUMNS} FROM rw_merged",
    ]


def band_wide_sql(where: str, source: str = "steps") -> str:
    """Per-step statistics across ranks from raw ``steps`` rows (or ``source``, a query of
    their run, metric, step and value), over finite values only.

    A NaN rank is the divergence detector's business; letting it poison the median would hide
    the healthy ranks' band. ``nonfinite`` counts what was left out.
    """
    fin = "FILTER (WHERE isfinite(value))"
    frm = source if source == "steps" else f"({source})"
    return f"""SELECT run, metric, step, n, nonfinite, q[1] AS median, q[2] AS p5, q[3] AS p95,
        vmin, vmax FROM (
            SELECT run, metric, step, count(value) {fin} AS n,
                count(value) FILTER (WHERE NOT isfinite(value)) AS nonfinite,
                quantile_cont(value, [0.5, 0.05, 0.95]) {fin} AS q,
                min(value) {fin} AS vmin, max(value) {fin} AS vmax
            FROM {frm} WHERE metric IS NOT NULL AND {where} GROUP BY run, metric, step)"""


BAND_COLUMNS = ("median", "p5", "p95", "vmin", "vmax")  # band table columns, in BAND_STATS order
BAND_KEYS = 2  # rollup rows per band bucket (band_part_sql)


def band_part_sql(wide: str, width: int) -> str:
    """The band's buckets of ``width`` steps from the wide band rows named ``wide`` (run,
    metric, step and the statistics), as two rollup rows each: key 0 counts and sums the
    medians, with the lowest p5 as its minimum and the highest p95 as its maximum; key 1 has
    the lowest min and the highest max. Steps without a finite value (no median) are left out.

    Two rows, not one per statistic: at 8 ranks a band row stands for 8 records, and five
    long rows per step made the band's rollups a large part of a flush (docs/benchmarks.md)."""
    group = f"run, metric, step // {width}"
    head = f"SELECT run, metric, {{}} AS key, step // {width} AS b, count(*) AS n"
    span = f"min(step) AS lo, max(step) AS hi FROM {wide} WHERE median IS NOT NULL GROUP BY {group}"
    return (
        f"{head.format(0)}, sum(median) AS s, min(p5) AS mn, arg_min(step, p5) AS mn_step, "
        f"max(p95) AS mx, arg_max(step, p95) AS mx_step, {span} UNION ALL "
        f"{head.format(1)}, 0.0 AS s, min(vmin) AS mn, arg_min(step, vmin) AS mn_step, "
        f"max(vmax) AS mx, arg_max(step, vmax) AS mx_step, {span}"
    )


def band_pivot_sql(buckets_sql: str) -> str:
    """One band point per bucket from merged band buckets (``band_part_sql``'s two keys)."""
    k0, k1 = "FILTER (WHERE key = 0)", "FILTER (WHERE key = 1)"
    return f"""SELECT b, min(lo) AS step, sum(s) {k0} / sum(n) {k0} AS median,
        min(mn) {k0} AS p5, max(mx) {k0} AS p95, min(mn) {k1} AS vmin, max(mx) {k1} AS vmax
        FROM ({buckets_sql}) GROUP BY b ORDER BY b"""


def choose_level(
    rows_per_key: float,
    span: int,
    max_points: int,
    points_per_bucket: int,
    keys: int = 1,
    all_keys: int | None = None,
) -> int:
    """Index into LEVELS of the level to read; -1 for raw rows.

    The finest level whose buckets fit ``max_points`` (``rows_per_key`` estimates one key's raw
    points in the range, ``span`` its width in steps). When few keys are asked for, a finer
    level is read as long as it stays under FINE_READ_ROWS; the caller then reduces it to
    ``max_points`` (``minmax_reduce``/``band_reduce``), so one rank zoomed gets the full budget.

    ``all_keys``: the keys the run has, when only ``keys`` of them are asked for. Rows are not
    indexed by key, so reading a few ranks scans every rank's rows of the range at that level:
    a level whose scan passes FINE_SCAN_ROWS is skipped for a coarser one (3 outlier ranks of
    a 4,096-rank run at 3,000 steps: 12 M raw rows scanned, against 0.8 M at level 16).
    """

    def rows(level: int) -> float:
        return rows_per_key if level < 0 else min(span // LEVELS[level] + 2, rows_per_key)

    def scan_ok(level: int) -> bool:
        if all_keys is None or all_keys <= keys or level >= len(LEVELS) - 1:
            return True
        return rows(level) * all_keys <= FINE_SCAN_ROWS

    fits = [i for i in range(-1, len(LEVELS)) if rows(i) * (points_per_bucket if i >= 0 else 1)
            <= max_points and scan_ok(i)]  # fmt: skip
    level = fits[0] if fits else len(LEVELS) - 1
    while level >= 0 and rows(level - 1) * keys <= FINE_READ_ROWS and scan_ok(level - 1):
        level -= 1
    return level


def bucket_sql(
    src: str,
    level: int,
    where: str,
    b_lo: int,
    b_hi: int,
    tail_sql: str | None = None,
    opens: str | None = None,
) -> str:
    """SQL for one row per (key, b) of level ``level`` in [b_lo, b_hi]: closed rows as they are
    stored (read without aggregation) plus the merged open rows of all finer levels and an
    optional raw tail. Rows come unsorted (``sort_buckets``). ``opens``: the open rows are
    not in the tables but in relations ``<opens><level index>`` already cut to ``where``
    (the series' open buckets in memory: openbuckets.py).

    ``where`` filters on run/metric/key with named parameters (``$run``...) bound by the caller;
    ``tail_sql`` yields bucket rows of this level (key, b and the aggregates) not yet in any
    table (the band's unsettled steps).
    """
    width = LEVELS[level]
    cols = "key, b, n, s, mn, mn_step, mx, mx_step, lo, hi"
    froms = [
        f"FROM {table(src, finer, True)} WHERE {where}"
        if opens is None
        else f"FROM (SELECT {NUMPY_BUCKET} FROM {opens}{i})"
        for i, finer in enumerate(LEVELS[: level + 1])
    ]
    parts = [
        f"SELECT key, b // {width // finer} AS b, n, s, mn, mn_step, mx, mx_step, lo, hi {frm}"
        for finer, frm in zip(LEVELS, froms, strict=False)  # froms: the levels <= level
    ]
    if tail_sql is not None:
        parts.append(f"SELECT key, b, n, s, mn, mn_step, mx, mx_step, lo, hi FROM ({tail_sql})")
    return (
        f"SELECT {cols} FROM {table(src, width)} WHERE {where} AND b BETWEEN {b_lo} AND {b_hi} "
        f"UNION ALL SELECT u.key, u.b, {MERGE_AGG} FROM ({' UNION ALL '.join(parts)}) u "
        f"WHERE u.b BETWEEN {b_lo} AND {b_hi} GROUP BY u.key, u.b"
    )


def sort_buckets(res: dict[str, np.ndarray], by: str = "b") -> dict[str, np.ndarray]:
    """Order rows by (key, ``by``): the bucket, or any column increasing with it within a key
    (a bucket's step, its minimum's step).

    Rows come as a few runs already in order (closed rows are stored per flush in (key, b)
    order, open rows last, scans hand row groups over in any order), which numpy's stable
    sort (timsort) merges in a few ms; so both columns are folded into one int64 sort key.
    """
    key = np.asarray(res["key"]).astype(np.int64)
    b = np.asarray(res[by]).astype(np.int64)
    if len(key) == 0:
        return res
    k0, b0 = int(key.min()), int(b.min())
    span = int(b.max()) - b0 + 1
    if (int(key.max()) - k0 + 1) * span >= 2**62:
        order = np.lexsort((b, key))
    else:
        combined = (key - k0) * span + (b - b0)
        if bool((np.diff(combined) > 0).all()):
            return res
        order = np.argsort(combined, kind="stable")
    return {name: np.asarray(col)[order] for name, col in res.items()}
