"""The series' open rollup buckets kept in memory (store/openbuckets.py), on real DuckDB
files: every level against brute force, the same reads before and after a close, nothing
rewritten on disk per flush. The rebuild after a SIGKILL is test_store.py's kill test."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest
from rankwatch.aggregator.store import openbuckets, rollup
from rankwatch.aggregator.store.db import Store

RUNS = ("a", "b")


def _deliveries(seed: int) -> tuple[dict, list]:
    """Rows of two runs x three ranks x 4,400 steps of loss, in step order in 6 uneven
    flushes, with 1 % of them held back and delivered last (late for closed buckets)."""
    rng = np.random.default_rng(seed)
    ranks, steps = 3, 4400
    key = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    data, flushes = {}, []
    for run in RUNS:
        value = rng.normal(size=len(step))
        value[rng.choice(len(value), 3)] = (math.nan, math.inf, -math.inf)
        data[run] = (key, step, value)
    order = np.argsort(step, kind="stable")
    late = rng.random(len(order)) < 0.01
    on_time, held = order[~late], order[late]
    for chunk in np.split(on_time, np.sort(rng.choice(len(on_time), 5, replace=False))):
        flushes.append(chunk)
    flushes.append(held)
    return data, flushes


def _expected(key: np.ndarray, step: np.ndarray, value: np.ndarray, width: int) -> dict:
    out = {}
    buckets = key.astype(np.int64) * 10**9 + step // width
    for kb in np.unique(buckets):
        v = value[buckets == kb]
        # DuckDB orders NaN above every number: a bucket holding one has it as its maximum
        mx = math.nan if np.isnan(v).any() else float(np.max(v))
        out[(int(kb // 10**9), int(kb % 10**9))] = (len(v), float(np.nanmin(v)), mx)
    return out


def _levels(s: Store, run: str, from_memory: bool) -> list[dict]:
    """Every bucket of every level: (key, b) -> (n, min, max), the open ones from memory or
    from the open tables."""
    out = []
    for level in range(len(rollup.LEVELS)):
        live_0, live_1, live_2 = (
            s._mirror.opens.rows(i, run, "loss", None) for i in range(len(rollup.LEVELS))
        )
        sql = rollup.bucket_sql("series", level, "run = $run AND metric = $metric", -(2**40),
                                2**40, opens="live_" if from_memory else None)  # fmt: skip
        with s._query() as cur:
            rows = cur.execute(sql, {"run": run, "metric": "loss"}).fetchall()
        del live_0, live_1, live_2
        got = {(k, b): (n, mn, mx) for k, b, n, _, mn, _, mx, _, _, _ in rows}
        assert len(got) == len(rows), "a bucket was returned twice"
        out.append(got)
    return out


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, w in want.items():
        assert repr(got[k]) == repr(w), k


def test_open_buckets_in_memory_read_as_the_tables_did_and_are_saved_at_close(
    tmp_path: Path,
) -> None:
    data, flushes = _deliveries(0)
    path = tmp_path / "s.duckdb"
    reads = {"max_points": 10**6}, {"max_points": 2000}, {"max_points": 60}, {"max_points": 6}
    with Store(path) as s:
        for rows in flushes:
            for run in RUNS:
                key, step, value = (c[rows] for c in data[run])
                s.append_steps(run, "loss", key, step, value)
            s.flush()
        for run in RUNS:
            for level, want in enumerate(_levels(s, run, from_memory=True)):
                _same(want, _expected(*data[run], rollup.LEVELS[level]))
        before = [s.series(run, "loss", **kw) for run in RUNS for kw in reads]
        before.append(s.series("a", "loss", ranks=[1], start=100, end=4200, max_points=300))
        opens = s._mirror.opens
        # the flushes wrote closed buckets only: the open tables on disk are stale, and say so
        with s._query() as cur:
            for width in rollup.LEVELS:
                table = rollup.table("series", width, True)
                assert cur.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        assert not openbuckets.saved(s._writer)
    con = duckdb.connect(str(path), read_only=True)
    saved = con.execute("SELECT count(*) FROM series_l16_open").fetchone()
    con.close()
    assert saved == (len(RUNS) * 3,)  # written at close: one open bucket per key
    with Store(path) as s:
        assert openbuckets.saved(s._writer) and repr(s._mirror.opens.as_rows()) == repr(
            opens.as_rows()
        )
        after = [s.series(run, "loss", **kw) for run in RUNS for kw in reads]
        after.append(s.series("a", "loss", ranks=[1], start=100, end=4200, max_points=300))
        assert repr(after) == repr(before)
        for run in RUNS:  # the tables hold what memory held
            for got, want in zip(_levels(s, run, False), _levels(s, run, True), strict=True):
                _same(got, want)


def test_a_query_never_pairs_one_flush_s_open_buckets_with_another_s_closed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollup, "FINE_READ_ROWS", 0)  # one rank is read at the level planned
    taken, results = threading.Event(), []
    real = openbuckets.OpenBuckets.rows

    def slow_rows(self: openbuckets.OpenBuckets, *args: object) -> openbuckets.Columns:
        out = real(self, *args)  # type: ignore[arg-type]
        if threading.current_thread().name == "reader":
            taken.set()
            time.sleep(0.3)  # the flush below commits meanwhile, unless it waits for the query
        return out

    with Store(tmp_path / "s.duckdb") as s:
        steps = np.arange(40)
        s.append_steps("r", "loss", np.zeros(40), steps, steps.astype(float))
        s.flush()  # open: the 256-step bucket 0 (steps 0-31) and the 16-step bucket 2 (32-39)
        monkeypatch.setattr(openbuckets.OpenBuckets, "rows", slow_rows)
        reader = threading.Thread(
            target=lambda: results.append(s.series("r", "loss", max_points=6)), name="reader"
        )
        reader.start()
        assert taken.wait(10)
        more = np.arange(40, 300)  # closes the 256-step bucket 0
        s.append_steps("r", "loss", np.zeros(len(more)), more, more.astype(float))
        s.flush()
        reader.join()
    # the bucket read once, as it was before the flush: its first and last step (value = step)
    assert results[0][0]["step"] == [0, 39]
