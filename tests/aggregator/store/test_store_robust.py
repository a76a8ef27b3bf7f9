"""The store under many runs, refused records, many threads, odd steps and bad files."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from rankwatch.agent.wire.records import EventRecord, StepRecord
from rankwatch.aggregator.store import db as store_mod
from rankwatch.aggregator.store import reads, rollup
from rankwatch.aggregator.store.db import Store, StoreError
from rankwatch.aggregator.store.setaside import SET_ASIDE_DIR

STEP_MIN = -(2**63)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def one_record_runs(n: int, prefix: str = "flood") -> list[StepRecord]:
    return [
        StepRecord(f"{prefix}{i}", 0, 1, 1e9, 1, "h", 1, 5, None, {"loss": float(i)})
        for i in range(n)
    ]


class Statements:
    """Counts the SQL statements the store's flush sends through rollup (every band settle
    and rollup fold does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        query, run_script = rollup.query, rollup.run_script

        def counted_query(cur, script, sql):  # type: ignore[no-untyped-def]
            self.count += len(script) + 1
            return query(cur, script, sql)

        def counted_run(cur, script):  # type: ignore[no-untyped-def]
            self.count += len(script)
            return run_script(cur, script)

        monkeypatch.setattr(rollup, "query", counted_query)
        monkeypatch.setattr(rollup, "run_script", counted_run)

    def during(self, fn) -> int:  # type: ignore[no-untyped-def]
        before = self.count
        fn()
        return self.count - before


def test_a_flush_of_many_runs_sends_as_many_statements_as_one_of_a_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 one-record runs cost the flush the statements 20 do, when they arrive and when
    their bands settle (their ranks gone silent); a real rank's record after them is stored."""
    counted = Statements(monkeypatch)
    costs = []
    for runs in (20, 2000):
        clock = Clock()
        with Store(tmp_path / f"s{runs}.duckdb", clock=clock) as s:
            s.append(one_record_runs(runs))
            arrive = counted.during(s.flush)
            clock.now += store_mod.BAND_STALE_S + 1
            settle = counted.during(s.flush)
            assert s._mirror.band["flood7"] == 5  # settled up to the run's last step
            assert s.band("flood7", "loss")["median"] == [7.0]
            s.append([StepRecord("real", 0, 1, 1e9, 1, "h", 1, 0, None, {"loss": 0.5})])
            s.flush()
            assert [r["run"] for r in s.runs()].count("real") == 1
            assert len(s.runs()) == runs + 1
            costs.append((arrive, settle))
    assert costs[0] == costs[1]


def test_an_idle_flush_looks_at_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs whose band is settled and that get no input cost a flush nothing."""
    counted = Statements(monkeypatch)
    clock = Clock()
    with Store(tmp_path / "s.duckdb", clock=clock) as s:
        s.append(one_record_runs(500))
        s.flush()
        clock.now += store_mod.BAND_STALE_S + 1
        s.flush()
        assert counted.during(s.flush) == 0


def test_a_record_duckdb_refuses_is_set_aside_and_the_others_are_stored(tmp_path: Path) -> None:
    """A host name with a lone surrogate cannot be stored: it goes to a JSONL file beside the
    store, is counted, and neither the records beside it nor later flushes are held back."""
    good = [StepRecord("r", 0, q, 1e9, 1, "h", 1, q, None, {"loss": float(q)}) for q in (1, 2)]
    bad = StepRecord("r", 1, 1, 1e9, 2, "h\ud800", 1, 1, None, {"loss": 9.0})
    later = StepRecord("r", 0, 3, 1e9, 1, "h", 1, 3, None, {"loss": 3.0})
    with Store(tmp_path / "s.duckdb") as s:
        s.append([good[0], bad, good[1]])
        s.flush()
        assert s.counters()["store_set_aside_records"] == 1
        assert [(r.rank, r.seq) for r in s.records("r")] == [(0, 1), (0, 2)]
        s.append([later])
        s.flush()
        assert [(r.rank, r.seq) for r in s.records("r")] == [(0, 1), (0, 2), (0, 3)]
    (kept,) = (tmp_path / SET_ASIDE_DIR).iterdir()
    (line,) = kept.read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["rank"] == 1 and json.loads(line)["metrics"] == {"loss": 9.0}


def test_reads_from_many_threads_while_flushing(tmp_path: Path) -> None:
    """More reader threads than read cursors, every read method, against a flushing writer:
    no error, and each reader only ever sees more records."""
    errors: list[BaseException] = []
    stop = threading.Event()
    with Store(tmp_path / "s.duckdb") as s:

        def reader() -> None:
            seen = 0
            try:
                while not stop.is_set():
                    s.series_columns("r", "loss", max_points=50)
                    s.band_columns("r", "loss", max_points=50)
                    s.events("r")
                    s.heartbeats("r")
                    stored = sum(hi - lo + 1 for _, _, _, lo, hi in s.seen_seqs())
                    assert stored >= seen
                    seen = stored
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(reads.READ_CURSORS * 2)]
        for t in threads:
            t.start()

        def writer() -> None:
            for chunk in range(15):
                steps = range(chunk * 20, chunk * 20 + 20)
                s.append([StepRecord("r", rank, q + 1, 1e9, 4, "h", 1, q, None, {"loss": 1.0})
                          for q in steps for rank in range(4)])  # fmt: skip
                s.append([EventRecord("r", 0, 10_000 + chunk, 1e9, 4, "h", 1, "note", 1, {})])
                s.flush()

        w = threading.Thread(target=writer)
        w.start()
        w.join()
        stop.set()
        for t in threads:
            t.join()
        assert errors == []
        assert s._reads.count <= reads.READ_CURSORS


def test_short_lived_threads_leave_no_cursor_behind(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        s.append(one_record_runs(3))
        s.flush()
        for _ in range(10):
            # a read that runs SQL (seen_seqs is in memory now)
            threads = [threading.Thread(target=s.heartbeats, args=("r",)) for _ in range(50)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert 1 <= s._reads.count <= reads.READ_CURSORS


def test_the_lowest_int64_step_reaches_the_band(tmp_path: Path) -> None:
    """Step -2**63 is a step like any other: stored, settled into the band, drawn."""
    with Store(tmp_path / "s.duckdb") as s:
        for rank in (0, 1):
            s.append([
                StepRecord("r", rank, 1, 1e9, 2, "h", 1, STEP_MIN, None, {"loss": 1.0 + rank}),
                StepRecord("r", rank, 2, 1e9, 2, "h", 1, STEP_MIN + 1, None, {"loss": 3.0}),
                EventRecord("r", rank, 3, 1e9, 2, "h", 1, "end", None, {}),
            ])  # fmt: skip
        s.flush()
        assert s.ranks("r")[0]["last_step"] == STEP_MIN + 1
        assert s._mirror.band["r"] == STEP_MIN + 1  # both steps settled
        band = s.band("r", "loss")
        assert band["step"] == [STEP_MIN, STEP_MIN + 1]
        np.testing.assert_allclose(band["median"], [1.5, 3.0])
        with s._query() as cur:
            rows = cur.execute("SELECT step, n FROM band ORDER BY step").fetchall()
        assert rows == [(STEP_MIN, 2), (STEP_MIN + 1, 2)]


def test_a_rank_at_the_lowest_step_holds_the_band_back(tmp_path: Path) -> None:
    """A live rank at -2**63: nothing lies below it to settle (and no overflow)."""
    with Store(tmp_path / "s.duckdb") as s:
        s.append([StepRecord("r", 0, 1, 1e9, 1, "h", 1, STEP_MIN, None, {"loss": 1.0})])
        s.flush()
        assert "r" not in s._mirror.band
        assert s.band("r", "loss")["median"] == [1.0]  # from the raw rows meanwhile


def test_a_corrupt_store_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    path.write_bytes(b"not a database at all " * 500)
    with pytest.raises(StoreError, match="cannot open") as info:
        Store(path)
    assert info.value.reason == "corrupt"
    assert "damaged" in info.value.hint and "another" not in info.value.hint


def test_a_store_locked_by_another_process_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    Store(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, duckdb; c = duckdb.connect(sys.argv[1]); print('ok', flush=True); "
         "sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(StoreError, match="cannot open") as info:
            Store(path)
    finally:
        holder.communicate("")
    assert info.value.reason == "locked"
    assert "another" in info.value.hint and "damaged" not in info.value.hint


def test_late_rows_into_many_settled_series_are_repaired_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill below the settled band of 40 metrics over two runs: one repair for all of
    them (as many statements as for one metric), every band and its rollups right after."""
    counted = Statements(monkeypatch)
    costs = []
    for metrics in (1, 40):
        names = [f"m{j}" for j in range(metrics)]
        with Store(tmp_path / f"s{metrics}.duckdb") as s:
            for run in ("a", "b"):
                s.append(
                    [
                        StepRecord(
                            run, 0, q + 1, 1e9, 1, "h", 1, q, None, {m: float(q) for m in names}
                        )
                        for q in range(0, 60, 2)
                    ]
                )
                s.append([EventRecord(run, 0, 100, 1e9, 1, "h", 1, "end", None, {})])
            s.flush()
            assert s._mirror.band == {"a": 58, "b": 58}
            for run in ("a", "b"):
                s.append(
                    [
                        StepRecord(
                            run, 0, q + 200, 1e9, 1, "h", 1, q, None, {m: float(q) for m in names}
                        )
                        for q in range(1, 60, 2)
                    ]
                )
            costs.append(counted.during(s.flush))
            assert s._mirror.late == {}
            for run in ("a", "b"):
                for m in (names[0], names[-1]):
                    band = s.band(run, m)
                    assert band["step"] == list(range(60))
                    assert band["median"] == [float(q) for q in range(60)]
                    coarse = s.band(run, m, max_points=2)  # read from the rebuilt rollups
                    assert min(coarse["min"]) == 0.0 and max(coarse["max"]) == 59.0
    assert costs[0] == costs[1]


def test_close_interrupts_a_long_flush_and_stores_its_records(tmp_path: Path) -> None:
    """close() does not wait out a long flush: it interrupts it, the interrupted flush keeps
    its records buffered, and close's own flush writes them."""
    path = tmp_path / "s.duckdb"
    n = 2_000_000
    s = Store(path)
    s.append_steps("r", "loss", np.arange(n) % 8, np.arange(n) // 8, np.ones(n))
    outcome: list[BaseException | None] = []

    def flusher() -> None:
        try:
            s.flush()
            outcome.append(None)
        except StoreError as exc:
            outcome.append(exc)

    t = threading.Thread(target=flusher)
    t.start()
    while not s._flush_lock.locked() and t.is_alive():
        threading.Event().wait(0.001)
    s.close(wait_s=0.05)
    t.join()
    (result,) = outcome
    assert result is not None and "interrupt" in str(result).lower()  # it was cut short
    with Store(path) as again:
        assert again.runs()[0]["records"] == n
        assert again.seen_seqs() == [("r", rank, 0, 1, n // 8) for rank in range(8)]
