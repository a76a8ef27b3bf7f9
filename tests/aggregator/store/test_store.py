"""The DuckDB store on real files: persistence, crash safety, queries, errors."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import duckdb
import numpy as np
import pytest
from rankwatch.agent.wire.records import EventRecord, Heartbeat, Record, StepRecord
from rankwatch.aggregator.store import db as store_mod
from rankwatch.aggregator.store.db import STORE_FILENAME, Store, StoreError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def step(run: str, rank: int, seq: int, step_: int, **metrics: float) -> StepRecord:
    return StepRecord(run, rank, seq, 1e9 + seq, 4, f"node{rank}", 100 + rank, step_, 0, metrics)


def grid(run: str, ranks: int, steps: range, fn, metric: str = "loss") -> list[StepRecord]:
    """Records in arrival order (step-major), seq = position in each rank's stream."""
    return [
        step(run, r, i + 1, s, **{metric: fn(r, s)})
        for i, s in enumerate(steps)
        for r in range(ranks)
    ]


def test_directory_path_gets_the_default_file_name(tmp_path: Path) -> None:
    with Store(tmp_path / "data") as s:
        assert s.path == tmp_path / "data" / STORE_FILENAME
    assert (tmp_path / "data" / STORE_FILENAME).exists()


def test_a_rank_that_moves_keeps_each_record_s_host_and_logs_only_its_moves(tmp_path: Path) -> None:
    def on(host: str, pid: int, rank: int, seq: int) -> StepRecord:
        return StepRecord("r", rank, seq, 1e9 + seq, 4, host, pid, seq, 0, {"loss": 1.0})

    flushes = [
        [on("a", 1, 0, 1), on("a", 1, 0, 2), on("b", 5, 1, 1)],
        [on("a", 1, 0, 3), on("c", 2, 0, 4), on("b", 5, 1, 2)],  # rank 0 moves mid-flush
        [on("a", 3, 0, 5), on("b", 5, 1, 3)],  # and back to a, a new process
        [on("a", 3, 0, 6), on("b", 5, 1, 4)],  # nothing moves
    ]
    path = tmp_path / "s.duckdb"
    with Store(path) as s:
        for records in flushes:
            s.append(records)
            s.flush()
    with Store(path) as s:
        got = {(g.rank, g.seq): (g.host, g.pid) for g in s.records("r")}
    assert got == {(r.rank, r.seq): (r.host, r.pid) for rs in flushes for r in rs}
    con = duckdb.connect(str(path), read_only=True)
    try:
        log = con.execute(
            "SELECT rank, seq, host, pid FROM rank_meta ORDER BY rank, seq"
        ).fetchall()
        summary = con.execute("SELECT rank, host, pid, records FROM ranks ORDER BY rank").fetchall()
    finally:
        con.close()
    # the log holds where each identity starts, once: a flush repeating the last one adds none
    assert log == [(0, 1, "a", 1), (0, 4, "c", 2), (0, 5, "a", 3), (1, 1, "b", 5)]
    assert summary == [(0, "a", 3, 6), (1, "b", 5, 4)]


def test_every_record_round_trips_through_a_reopen(tmp_path: Path) -> None:
    records: list[Record] = [
        EventRecord("r", 0, 1, 10.0, 2, "h0", 7, "start", None, {"launcher": "msrun"}),
        step("r", 0, 2, 1, loss=1.5, lr=0.1),
        step("r", 0, 3, 2, loss=math.nan, lr=math.inf),
        step("r", 0, 4, 3, loss=-math.inf),
        step("r", 0, 5, 4),  # a step record with no metrics is stored too
        Heartbeat("r", 0, 6, 11.0, 4, 5.0, 3, paused="checkpoint"),
        step("r", 1, 1, 1, loss=2.5),
        EventRecord("r", 1, 2, 12.0, 2, "h1", 8, "crash", 1, {"exc_type": "E", "n": math.nan}),
        step("other", 0, 1, 1, acc=0.5),
    ]
    path = tmp_path / "s.duckdb"
    with Store(path) as s:
        s.append(records[:4])
        s.flush()
        s.append(records[4:])
    with Store(path) as s:
        got = list(s.records("r"))
        want = [r for r in records if r.run == "r"]
        assert [(g.rank, g.seq, g.kind) for g in got] == sorted(
            (w.rank, w.seq, w.kind) for w in want
        )
        by_key = {(g.rank, g.seq): g for g in got}
        for w in want:
            g = by_key[(w.rank, w.seq)]
            if isinstance(w, StepRecord):
                assert (g.step, g.epoch, g.time, g.host, g.pid, g.world_size) == (
                    w.step, w.epoch, w.time, w.host, w.pid, w.world_size,
                )  # fmt: skip
                assert repr(sorted(g.metrics.items())) == repr(sorted(w.metrics.items()))
            elif isinstance(w, EventRecord):
                assert (g.event, g.step, g.host) == (w.event, w.step, w.host)
                assert repr(dict(g.info)) == repr(dict(w.info))
            else:
                assert g == w
        assert s.metrics("r") == ["loss", "lr"]
        assert s.metrics("other") == ["acc"]
        runs = {r["run"]: r for r in s.runs()}
        assert runs["r"] == {
            "run": "r", "world_size": 4, "ranks": 2, "first_time": 10.0,
            "last_time": 1e9 + 5, "records": 8, "last_step": 4,
        }  # fmt: skip
        assert [e["event"] for e in s.events("r")] == ["start", "crash"]
        assert s.events("r")[1]["info"]["exc_type"] == "E"
        assert s.heartbeats("r")[0]["paused"] == "checkpoint"
        ranks = {r["rank"]: r for r in s.ranks("r")}
        assert ranks[1]["ended"] and not ranks[0]["ended"]
        series = s.series("r", "loss")
        assert series[0]["step"] == [1, 2, 3]
        assert series[0]["value"][0] == 1.5
        assert math.isnan(series[0]["value"][1]) and series[0]["value"][2] == -math.inf


def test_seen_seqs_are_merged_intervals(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        s.append([step("r", 0, q, q, x=1.0) for q in (1, 2, 3, 7, 8)])
        s.flush()
        s.append([step("r", 0, q, q, x=1.0) for q in (4, 10)])
        s.append([Heartbeat("r", 1, 5, 1.0, None, 5.0, 0)])
        s.flush()
        assert s.seen_seqs() == [
            ("r", 0, 0, 1, 4), ("r", 0, 0, 7, 8), ("r", 0, 0, 10, 10), ("r", 1, 0, 5, 5),
        ]  # fmt: skip


def test_series_keeps_a_one_step_spike_and_the_budget(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        for chunk in range(10):
            s.append(
                grid("r", 4, range(chunk * 2000, (chunk + 1) * 2000),
                     lambda r, st: 5000.0 if (r, st) == (2, 12_345) else math.sin(st / 500) + r)
            )  # fmt: skip
            s.flush()
        for max_points in (50, 300, 2000):
            out = s.series("r", "loss", max_points=max_points)
            assert sorted(out) == [0, 1, 2, 3]
            for rank, pts in out.items():
                assert 0 < len(pts["step"]) <= max_points
                assert pts["step"] == sorted(pts["step"])
                assert all(lo <= v <= hi for v, lo, hi in
                           zip(pts["value"], pts["min"], pts["max"], strict=True))  # fmt: skip
                if rank == 2:
                    assert 5000.0 in pts["value"]
                    assert pts["step"][pts["value"].index(5000.0)] == 12_345
                else:
                    assert max(pts["value"]) < 10
        zoom = s.series("r", "loss", ranks=[2, 9], start=12_300, end=12_400)
        assert list(zoom) == [2]  # unknown ranks are left out
        assert zoom[2]["step"] == list(range(12_300, 12_401))  # raw rows, exact
        assert zoom[2]["value"][45] == 5000.0
        assert s.series("r", "nope") == {} and s.series("nope", "loss") == {}


def test_band_matches_numpy_quantiles(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    values = rng.normal(size=(8, 60))
    values[3, 10] = math.nan  # ignored by the band, like np.nanquantile does
    values[5, 20] = math.inf
    clock = Clock()
    with Store(tmp_path / "s.duckdb", clock=clock) as s:
        for part in (range(0, 30), range(30, 60)):
            s.append(grid("r", 8, part, lambda r, st: float(values[r, st])))
            s.flush()
        band = s.band("r", "loss")
        finite = np.where(np.isfinite(values), values, np.nan)
        assert band["step"] == list(range(60))
        for name, q in (("p5", 0.05), ("median", 0.5), ("p95", 0.95)):
            np.testing.assert_allclose(band[name], np.nanquantile(finite, q, axis=0))
        np.testing.assert_allclose(band["min"], np.nanmin(finite, axis=0))
        np.testing.assert_allclose(band["max"], np.nanmax(finite, axis=0))
        # every rank is live, so the last step is still computed from raw rows
        done = s._mirror.band.get("r")
        assert done == 58
        coarse = s.band("r", "loss", max_points=10)
        assert len(coarse["step"]) <= 10
        assert min(coarse["min"]) == pytest.approx(np.nanmin(finite))
        assert max(coarse["max"]) == pytest.approx(np.nanmax(finite))


@pytest.mark.parametrize("big", [False, True])
def test_band_of_a_run_imported_rank_after_rank_is_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big: bool
) -> None:
    if big:  # a repair too big to do at once waits until the run has gone quiet
        monkeypatch.setattr(store_mod, "BAND_REPAIR_ROWS", 0)
    clock = Clock()
    values = np.arange(40.0).reshape(2, 20)
    values[1] += 100
    with Store(tmp_path / "s.duckdb", clock=clock) as s:
        for rank in (0, 1):
            s.append([step("r", rank, i + 1, i, loss=float(values[rank, i])) for i in range(20)])
            s.append([EventRecord("r", rank, 21, 1.0, 2, "h", 1, "end", None, {})])
            s.flush()
            if rank == 0:  # a slow import: rank 0's band settles before rank 1 is read
                clock.now += store_mod.BAND_WAIT_UNSEEN_S + 1
                s.flush()
                np.testing.assert_allclose(s.band("r", "loss")["median"], values[0])
        if big:
            np.testing.assert_allclose(s.band("r", "loss")["median"], values[0])  # not yet
            clock.now += store_mod.BAND_REPAIR_QUIET_S + 1
            s.flush()
        repaired = s.band("r", "loss")
        np.testing.assert_allclose(repaired["median"], np.median(values, axis=0))
        np.testing.assert_allclose(repaired["max"], values[1])
        coarse = s.band("r", "loss", max_points=2)  # the band's rollups were rebuilt too
        assert max(coarse["max"]) == values[1].max() and min(coarse["min"]) == 0.0


def test_concurrent_queries_during_ingest(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()
    with Store(tmp_path / "s.duckdb") as s:

        def reader() -> None:
            try:
                while not stop.is_set():
                    for rank, points in s.series("r", "loss", max_points=100).items():
                        # value = step: each bucket is drawn at its first and last step, so
                        # a bucket read twice (closed, and open from another flush) or not at
                        # all breaks the chain 0, w-1, w, 2w-1, ...
                        steps = np.asarray(points["step"])
                        assert steps[0] == 0 and (np.diff(steps)[1::2] == 1).all(), (rank, steps)
                    s.band("r", "loss", max_points=100)
                    s.runs()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for chunk in range(20):
            s.append(grid("r", 8, range(chunk * 50, (chunk + 1) * 50), lambda r, st: float(st)))
            s.flush()
        stop.set()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(len(p["step"]) for p in s.series("r", "loss", max_points=5000).values()) == 8000


_CHILD = textwrap.dedent(
    """
    import sys
    from rankwatch.agent.wire.records import StepRecord
    from rankwatch.aggregator.store.db import Store

    store = Store(sys.argv[1])
    seq = 0
    while True:
        batch = []
        for _ in range(50):
            seq += 1
            batch += [StepRecord("r", rank, seq, 1.0, 4, "h", 1, seq, None, {"loss": seq * 0.5})
                      for rank in range(4)]
        store.append(batch)
        store.flush()
        print(seq, flush=True)  # everything up to seq is committed
    """
)


def test_kill_9_mid_ingest_keeps_every_flushed_record(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    path = tmp_path / "s.duckdb"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    flushed = 0
    for line in proc.stdout:
        flushed = int(line)
        if flushed >= 3000:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # the series' open buckets were in memory only: the open tables on disk say they are stale
    con = duckdb.connect(str(path))
    assert con.execute("SELECT value FROM meta WHERE key = 'series_open'").fetchone() == ("live",)
    con.close()
    with Store(path) as s:
        # ... and were rebuilt from the committed rows: as a store given the same rows has them
        (_, _, _, _, hi), *_ = s.seen_seqs()
        with Store(tmp_path / "same.duckdb") as same:
            same.append([StepRecord("r", rank, q, 1.0, 4, "h", 1, q, None, {"loss": q * 0.5})
                         for q in range(1, hi + 1) for rank in range(4)])  # fmt: skip
            same.flush()
            assert s._mirror.opens.as_rows() == same._mirror.opens.as_rows()
        (run, rank, inc, lo, hi), *_ = s.seen_seqs()
        assert (run, rank, inc, lo) == ("r", 0, 0, 1) and hi >= flushed
        assert len(s.seen_seqs()) == 4  # one unbroken interval per rank
        series = s.series("r", "loss", ranks=[3], start=1, end=flushed, max_points=10**6)
        assert series[3]["step"] == list(range(1, flushed + 1))
        assert series[3]["value"] == [q * 0.5 for q in range(1, flushed + 1)]
        coarse = s.series("r", "loss", max_points=100)  # rollups agree with the raw rows
        assert max(coarse[0]["value"]) == hi * 0.5
        # and the store keeps accepting writes after the crash
        s.append([StepRecord("r", 0, hi + 1, 1.0, 4, "h", 1, hi + 1, None, {"loss": 0.0})])
        s.flush()
        assert s.seen_seqs()[0] == ("r", 0, 0, 1, hi + 1)


def test_unwritable_location_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open"):
        Store(blocker / "s.duckdb")


def test_store_locked_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, duckdb; c = duckdb.connect(sys.argv[1]); print('ok', flush=True); "
         "sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(StoreError, match="cannot open"):
            Store(path)
    finally:
        holder.communicate("")


_FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    from rankwatch.agent.wire.records import StepRecord
    from rankwatch.aggregator.store.db import Store, StoreError

    def rec(q, n=1):
        return StepRecord("r", 0, q, 1.0, 1, "h", 1, q, None, {f"m{i}": 1.0 for i in range(n)})

    store = Store(sys.argv[1])
    store.append([rec(1)])
    store.flush()
    # the disk fills up: writes past 1 byte fail with EFBIG instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    unlimited = resource.RLIM_INFINITY
    for batch in ([rec(q, 50) for q in range(2, 3000)], [rec(3000)]):  # big and small (WAL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, unlimited))
        store.append(batch)
        try:
            store.flush()
        except StoreError as exc:
            print("StoreError:", exc, flush=True)
        print("live queries:", store.seen_seqs(), flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (unlimited, unlimited))
        store.flush()  # space again: everything buffered is written
        print("recovered:", store.seen_seqs(), flush=True)
    """
)


def test_full_disk_raises_store_error_then_recovers(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_FULL_DISK)
    path = tmp_path / "s.duckdb"
    out = subprocess.run(
        [sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 6, out.stdout
    for i in (0, 3):
        assert lines[i].startswith("StoreError: cannot write to the store"), lines[i]
        assert "File too large" in lines[i]
    assert lines[1] == "live queries: [('r', 0, 0, 1, 1)]"
    assert lines[2] == "recovered: [('r', 0, 0, 1, 2999)]"
    assert lines[4] == "live queries: [('r', 0, 0, 1, 2999)]"
    assert lines[5] == "recovered: [('r', 0, 0, 1, 3000)]"
    with Store(path) as s:
        assert s.seen_seqs() == [("r", 0, 0, 1, 3000)]
        assert s.runs()[0]["records"] == 3000
        assert s.series("r", "m49", max_points=5000)[0]["step"] == list(range(2, 3000))


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    s = Store(tmp_path / "s.duckdb")
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.append([step("r", 0, 1, 1, loss=1.0)])
    with pytest.raises(StoreError, match="closed"):
        s.series("r", "loss")


def test_append_steps_bulk_path(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        rank = np.repeat(np.arange(3), 100)
        st = np.tile(np.arange(100), 3)
        s.append_steps("b", "loss", rank, st, st * 2.0, world_size=3)
        s.flush()
        assert s.runs()[0]["records"] == 300 and s.runs()[0]["world_size"] == 3
        assert s.series("b", "loss")[1]["value"] == [x * 2.0 for x in range(100)]
        assert s.seen_seqs() == [("b", r, 0, 1, 100) for r in range(3)]


def test_append_refuses_what_is_not_a_record_and_keeps_nothing_of_that_call(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        s.append([step("r", 0, 1, 1, loss=1.0)])
        with pytest.raises(TypeError, match="takes records, got dict"):
            s.append([step("r", 0, 2, 2, loss=2.0), {"kind": "step"}])  # type: ignore[list-item]
        s.flush()
        assert [r.seq for r in s.records("r")] == [1]


def test_a_backlog_too_big_for_memory_is_written_in_parts(tmp_path: Path) -> None:
    """With a 32 MB buffer pool, 20,000 records of 10 metrics over 50 runs do not fit in one
    flush (DuckDB runs out of memory); the store writes them in halves instead of failing for
    good, and every record is stored."""
    recs = [
        StepRecord(f"run{i % 50}", i % 8, i // 8 + 1, 1e9 + i, 8, "h", 1, i // 8, None,
                   {f"m{j}": float(i + j) for j in range(10)})
        for i in range(20_000)
    ]  # fmt: skip
    with Store(tmp_path / "s.duckdb", memory_limit="32MB") as s:
        s.append(recs)
        s.flush()
        assert sum(r["records"] for r in s.runs()) == 20_000
        got = list(s.records("run7"))
        assert len(got) == 400 and all(len(g.metrics) == 10 for g in got)
        for g in got:  # record i has rank i % 8, seq i // 8 + 1 and values i + j
            i = (g.seq - 1) * 8 + g.rank
            assert g.metrics == {f"m{j}": float(i + j) for j in range(10)}


def test_a_hung_rank_sending_only_heartbeats_releases_the_band(tmp_path: Path) -> None:
    """Steps are settled into the band behind the slowest live rank; a rank whose steps stopped
    while its heartbeats go on (hung in a collective) stops counting after BAND_STALE_S."""
    clock = Clock()

    def done(s: Store) -> int:
        with s._query() as cur:
            return cur.execute("SELECT done FROM band_done WHERE run = 'r'").fetchone()[0]

    with Store(tmp_path / "s.duckdb", clock=clock) as s:
        seq = dict.fromkeys(range(4), 0)

        def send(rank: int, rec_step: int | None) -> None:
            seq[rank] += 1
            if rec_step is None:
                s.append([Heartbeat("r", rank, seq[rank], clock.now, 5, 1.0, 0, None)])
            else:
                s.append([step("r", rank, seq[rank], rec_step, loss=1.0 + rank)])

        for st in range(1, 21):  # rank 3 hangs after step 5: heartbeats only from then on
            for rank in range(4):
                send(rank, st if rank < 3 or st <= 5 else None)
            clock.now += 1.0
            s.flush()
        assert done(s) == 4  # held back by rank 3 while its heartbeats are recent
        last = 5 + int(store_mod.BAND_STALE_S) + 5  # well past the stale limit of rank 3
        for st in range(21, last + 1):
            for rank in range(4):
                send(rank, st if rank < 3 else None)
            clock.now += 1.0
            s.flush()
        assert done(s) == last - 1  # the live ranks' latest step - 1


def test_a_store_from_before_the_two_row_band_rollups_is_upgraded_on_open(tmp_path: Path) -> None:
    """Schema 1 kept one band rollup row per statistic (five per bucket); opening such a store
    folds the band's rollups again from its rows, once, and every band query reads the same."""
    from rankwatch.aggregator.store import rollup

    path = tmp_path / "s.duckdb"
    values = np.random.default_rng(3).normal(size=(4, 700))
    asks = (2000, 300, 40, 5)
    with Store(path) as s:
        s.append(grid("r", 4, range(700), lambda r, st: float(values[r, st])))
        s.append([EventRecord("r", r, 701, 1.0, 4, "h", 1, "end", None, {}) for r in range(4)])
        s.flush()
        assert s._mirror.band["r"] == 699
        before = {n: s.band_columns("r", "loss", max_points=n) for n in asks}

    def keys(con: duckdb.DuckDBPyConnection) -> set[int]:
        rows = " UNION ".join(
            f"SELECT DISTINCT key FROM {rollup.table('band', w, o)}"
            for w in rollup.LEVELS
            for o in (False, True)
        )
        return {k for (k,) in con.execute(rows).fetchall()}

    # the band's rollups as schema 1 wrote them
    con = duckdb.connect(str(path))
    stats = ("median", "p5", "p95", "vmin", "vmax")
    long = " UNION ALL ".join(
        f"SELECT run, metric, {i} AS key, step, {c} AS value FROM rw_band"
        for i, c in enumerate(stats)
    )
    script = ["BEGIN TRANSACTION"]
    script += [f"DELETE FROM {rollup.table('band', w, o)}" for w in rollup.LEVELS for o in (0, 1)]
    script.append("CREATE TEMP TABLE rw_band AS SELECT * FROM band")
    script = rollup.fold(con, "band", rollup.raw_part(long), script)
    rollup.run_script(con, [*script, "UPDATE meta SET value = '1'", "COMMIT"])
    assert keys(con) == {0, 1, 2, 3, 4}
    con.close()

    with Store(path) as s:
        with s._query() as cur:
            version = cur.execute("SELECT value FROM meta WHERE key = 'schema_version'")
            assert version.fetchone() == (str(store_mod.SCHEMA_VERSION),)
            assert keys(cur) == {0, 1}
        for n in asks:
            after = s.band_columns("r", "loss", max_points=n)
            assert after["step"].tolist() == before[n]["step"].tolist(), n
            for name in ("median", "p5", "p95", "min", "max"):
                np.testing.assert_allclose(after[name], before[n][name], rtol=1e-12, err_msg=name)
        coarse = s.band("r", "loss", max_points=5)
        assert min(coarse["min"]) == values.min() and max(coarse["max"]) == values.max()
    with Store(path) as s:  # upgraded once: opening again changes nothing
        assert (
            s.band_columns("r", "loss", max_points=40)["median"].tolist()
            == before[40]["median"].tolist()
        )


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb"):
        pass
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(99)])
    con.close()
    with pytest.raises(StoreError, match="has schema 99, newer than"):
        Store(tmp_path / "s.duckdb")


def test_run_summaries_follow_each_flush(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.append(grid("a", 2, range(1, 4), lambda r, s: 1.0))
        store.flush()
        first = store.runs()
        assert [(r["run"], r["records"], r["last_step"]) for r in first] == [("a", 6, 3)]
        first[0]["records"] = -1  # a caller's copy: the kept summary is not touched
        assert store.runs()[0]["records"] == 6
        store.append([step("a", 0, 4, 9, loss=1.0), step("b", 0, 1, 1, loss=2.0)])
        store.flush()
        got = {r["run"]: (r["records"], r["last_step"], r["ranks"]) for r in store.runs()}
        assert got == {"a": (7, 9, 2), "b": (1, 1, 1)}
