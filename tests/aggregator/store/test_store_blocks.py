"""StepBlocks in the store: stored exactly as their records would be, mixed with records, and
split/absorbed on the failure paths without losing or duplicating a row."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from rankwatch.agent.wire.records import EventRecord, Heartbeat, StepBlock, StepRecord, unblock
from rankwatch.aggregator.store import openbuckets, rollup
from rankwatch.aggregator.store.buffer import Batch, split_block
from rankwatch.aggregator.store.db import Store

TABLES = [
    "steps", "events", "heartbeats", "ranks", "rank_meta", "seqs", "band", "band_done",
    "band_late",
    *(rollup.table(src, w, o) for src in rollup.SOURCES for w in rollup.LEVELS
      for o in (False, True)),
]  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def block(
    run: str, rank: int, seqs: range, metrics: tuple[str, ...], *, host: str = "h", epoch=None
) -> StepBlock:
    """Steps = seq - 1; distinct values per (rank, seq, metric), one NaN and one inf."""
    seq = list(seqs)

    def value(q: int, j: int) -> float:
        if q == 17 and j == 0:  # one per series: arg_max has no tie to break
            return math.nan
        if q == 23 and j == 1:
            return math.inf
        return rank * 1000.0 + q + j / 10

    return StepBlock(
        run, rank, 4, host, 100 + rank, seq, [1e9 + q / 8 for q in seq], [q - 1 for q in seq],
        [epoch if epoch != "mixed" else (None if q % 2 else q // 10) for q in seq],
        {m: [value(q, j) for q in seq] for j, m in enumerate(metrics)},
    )  # fmt: skip


def contents(s: Store) -> dict[str, str]:
    """Every table's rows, sorted, as text (NaN compares equal to NaN this way). Floats to 12
    digits: DuckDB sums rows in whatever order its threads meet them (the last bit varies)."""
    out = {}
    with s._query() as cur:
        for t in TABLES:
            rows = [
                tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in row)
                for row in cur.execute(f"SELECT * FROM {t}").fetchall()
            ]
            out[t] = repr(sorted(rows, key=repr))
    return out


def stored_alike(tmp_path: Path, flushes: list[list], clock_step: float = 1.0) -> None:
    """Store ``flushes`` as given and with every block expanded to its records; compare."""
    results = []
    for name, expand in (("blocks", False), ("records", True)):
        clock = Clock()
        with Store(tmp_path / f"{name}.duckdb", clock=clock) as s:
            for items in flushes:
                if expand:
                    items = unblock(items)
                s.append(items)
                clock.now += clock_step
                s.flush()
            results.append((contents(s), s.runs(), s.ranks("r"), s.seen_seqs(), s._mirror))
    (got, runs_b, ranks_b, seqs_b, mirror_b), (want, runs_r, ranks_r, seqs_r, mirror_r) = results
    for t in TABLES:
        assert got[t] == want[t], t
    assert (runs_b, ranks_b, seqs_b) == (runs_r, ranks_r, seqs_r)
    # the series' open buckets (in memory), to 12 digits like the tables' floats; as text, so
    # NaN is equal to NaN
    assert repr(_rounded(mirror_b.opens.as_rows())) == repr(_rounded(mirror_r.opens.as_rows()))
    assert dataclasses.replace(mirror_b, opens=mirror_r.opens) == mirror_r


def _rounded(rows: list[tuple]) -> list[tuple]:
    return [tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in r) for r in rows]


def test_a_block_stores_exactly_what_its_records_would(tmp_path: Path) -> None:
    m = ("loss", "lr", "grad_norm")
    flushes = [
        [block("r", k, range(1, 41), m) for k in range(4)],  # one shape: the fast path
        [block("r", k, range(41, 41 + 10 * (k + 1)), m[: k + 1], epoch="mixed") for k in range(4)],
        [block("r", 0, range(81, 120), ()), block("r", 1, range(81, 90), m, epoch=3)],
        [block("r", 2, range(200, 260), m, host="other")],  # a rank restarted elsewhere
    ]
    stored_alike(tmp_path, flushes)


def test_blocks_with_gaps_or_seqs_out_of_order_keep_exact_seq_intervals(tmp_path: Path) -> None:
    # A block of consecutive seqs is one bookkeeping row; any other block's records are rows
    # of their own. Either way the seq intervals and rank summaries are those of its records.
    m = ("loss",)
    flushes = [
        [block("r", 0, range(1, 11), m), block("r", 0, [11, 13, 14], m),  # a gap inside
         block("r", 1, [3, 1, 2], m), block("r", 2, range(1, 1), m),  # out of order; empty
         block("r", 3, range(1, 5), m), block("r", 3, range(8, 10), m)],  # a gap between
        [block("r", 0, [12], m), block("r", 1, range(4, 8), m), block("r", 1, [20, 21], m),
         block("r", 3, [7, 5, 6], m)],  # both gaps filled
    ]  # fmt: skip
    stored_alike(tmp_path, flushes)
    with Store(tmp_path / "s.duckdb") as s:
        s.append(flushes[0])
        s.flush()
        assert s.seen_seqs() == [
            ("r", 0, 0, 1, 11), ("r", 0, 0, 13, 14), ("r", 1, 0, 1, 3), ("r", 3, 0, 1, 4),
            ("r", 3, 0, 8, 9),
        ]  # fmt: skip
        s.append(flushes[1])
        s.flush()
        assert s.seen_seqs() == [("r", 0, 0, 1, 14), ("r", 1, 0, 1, 7), ("r", 1, 0, 20, 21),
                                 ("r", 3, 0, 1, 9)]  # fmt: skip
        ranks = {r["rank"]: r for r in s.ranks("r")}
        assert {k: (r["records"], r["last_step"]) for k, r in ranks.items()} == {
            0: (14, 13), 1: (9, 20), 3: (9, 8),
        }  # fmt: skip
        assert (ranks[1]["first_time"], ranks[1]["last_time"]) == (1e9 + 1 / 8, 1e9 + 21 / 8)


def test_a_nan_time_in_a_block_summarises_as_its_records_would(tmp_path: Path) -> None:
    # a block is one bookkeeping row; its first/last time must be what min()/max() over its
    # records give (NaN sorts above every number in DuckDB: the first time skips it, the last
    # time is NaN)
    nan_block = block("r", 0, range(1, 6), ("loss",))
    nan_block.time[2] = math.nan
    summaries = []
    for expand in (False, True):
        with Store(tmp_path / f"{expand}.duckdb") as s:
            s.append(unblock([nan_block]) if expand else [nan_block])
            s.flush()
            summaries.append(repr(s.ranks("r")))
    assert summaries[0] == summaries[1]
    assert "'first_time': 1000000000.125" in summaries[0] and "'last_time': nan" in summaries[0]


def test_a_record_appended_twice_does_not_hide_a_gap(tmp_path: Path) -> None:
    # seqs 1, 1, 3: as many rows as seqs 1..3 would have; seq 2 must still show as missing,
    # or it would never be resent or imported
    rec = StepRecord("r", 0, 1, 1e9, 4, "h", 100, 0, None, {"loss": 0.5})
    with Store(tmp_path / "s.duckdb") as s:
        s.append([rec, rec, StepRecord("r", 0, 3, 1e9, 4, "h", 100, 2, None, {"loss": 0.4})])
        s.flush()
        assert s.seen_seqs() == [("r", 0, 0, 1, 1), ("r", 0, 0, 3, 3)]


def test_an_empty_metrics_block_stores_a_row_per_record(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        s.append([block("r", 0, range(1, 6), ())])
        s.flush()
        got = list(s.records("r"))
        assert [(g.seq, g.step, dict(g.metrics)) for g in got] == [
            (q, q - 1, {}) for q in range(1, 6)
        ]
        assert s.runs()[0]["records"] == 5 and s.metrics("r") == []
        stored_alike(tmp_path / "x", [[block("r", 0, range(1, 6), ())]])


def test_blocks_mixed_with_records_events_and_heartbeats(tmp_path: Path) -> None:
    m = ("loss", "acc")
    start = EventRecord("r", 0, 1, 5.0, 4, "h", 100, "start", None, {"launcher": "msrun"})
    flushes = [
        [start, block("r", 0, range(2, 30), m), block("r", 1, range(1, 30), m),
         StepRecord("r", 2, 1, 1e9, 4, "h", 102, 0, None, {"loss": 0.5}),
         Heartbeat("r", 3, 1, 1e9, None, 5.0, 0)],
        [StepRecord("r", 2, 2, 1e9, 4, "h", 102, 1, 0, {"loss": 0.25, "acc": 0.1}),
         block("r", 0, range(30, 70), m), block("other", 0, range(1, 3), ("x",)),
         EventRecord("r", 1, 30, 6.0, 4, "h", 101, "end", 28, {}),
         Heartbeat("r", 2, 3, 1e9, 1, 5.0, 0, paused="ckpt")],
    ]  # fmt: skip
    stored_alike(tmp_path, flushes)


def test_values_arriving_late_through_blocks_repair_the_band_alike(tmp_path: Path) -> None:
    # rank 1's steps come long after the band settled on rank 0's: late values, band repair
    flushes = [
        [block("r", 0, range(1, 50), ("loss",))],
        [block("r", 0, range(50, 60), ("loss",))],
        [block("r", 1, range(1, 60), ("loss",))],
        [block("r", 1, range(60, 61), ("loss",)), block("r", 0, range(60, 61), ("loss",))],
    ]
    stored_alike(tmp_path, flushes, clock_step=100.0)


def test_split_cuts_a_lone_block_and_keeps_every_row() -> None:
    b = block("r", 0, range(1, 12), ("loss", "lr"))
    batch = Batch()
    batch.extend([b])
    halves = batch.split()
    assert halves is not None
    first, second = halves
    assert all(isinstance(x.records[0], StepBlock) for x in halves)
    got = first.records[0].records() + second.records[0].records()
    assert got == b.records()
    assert len(first.records[0]) == 5 and len(second.records[0]) == 6
    one = Batch()
    one.extend([block("r", 0, range(1, 2), ("loss",))])
    assert one.split() is None  # one record: nothing left to cut
    a, c = split_block(b)
    assert a.seq + c.seq == b.seq and a.metrics["lr"] + c.metrics["lr"] == b.metrics["lr"]


def test_absorb_counts_block_rows_and_drops_whole_blocks_oldest_first() -> None:
    old = Batch()
    old.extend([block("r", 0, range(1, 11), ("a", "b")), block("r", 0, range(11, 21), ("a",))])
    newer = Batch()
    newer.extend([StepRecord("r", 0, 21, 1.0, 1, "h", 1, 20, None, {"a": 1.0})])
    # rows: 10 x (1 + 2) = 30, 10 x (1 + 1) = 20, 1 + 1 = 2
    dropped = old.absorb(newer, cap_rows=25)
    assert dropped == 30
    assert [len(r) if isinstance(r, StepBlock) else 1 for r in old.records] == [10, 1]
    assert old.absorb(Batch(), cap_rows=0) == 20  # the newest piece always stays
    assert len(old.records) == 1


def test_a_backlog_of_blocks_too_big_for_memory_is_written_in_parts(tmp_path: Path) -> None:
    """As test_store's backlog test, with blocks: the flush halves the batch, then cuts the
    blocks, until each part fits in a 32 MB buffer pool; every record is stored once."""
    names = tuple(f"m{j}" for j in range(10))
    blocks = [block(f"run{i}", k, range(1, 251), names) for i in range(10) for k in range(8)]
    with Store(tmp_path / "s.duckdb", memory_limit="32MB") as s:
        s.append(blocks)
        s.flush()
        assert sum(r["records"] for r in s.runs()) == 20_000
        assert s.seen_seqs() == [(f"run{i}", k, 0, 1, 250) for i in range(10) for k in range(8)]
        got = list(s.records("run7"))
        assert len(got) == 2000 and all(len(g.metrics) == 10 for g in got)
        with s._query() as cur:
            assert cur.execute("SELECT count(*) FROM steps").fetchone() == (200_000,)


def test_a_malformed_block_is_refused_with_its_column_named(tmp_path: Path) -> None:
    bad = block("r", 0, range(1, 5), ("loss",))
    bad.metrics["loss"].pop()
    with Store(tmp_path / "s.duckdb") as s:
        with pytest.raises(ValueError, match="column metric 'loss' has 3 entries for 4 records"):
            s.append([block("r", 1, range(1, 3), ("loss",)), bad])
        s.flush()
        assert s.runs() == []  # nothing of the refused call was kept


def test_a_failed_flush_keeps_its_blocks_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankwatch.aggregator.store import db as store_mod

    with Store(tmp_path / "s.duckdb") as s:
        s.append([block("r", 0, range(1, 21), ("loss",))])
        real = openbuckets.fold

        def broken(*args, **kwargs):
            raise store_mod.duckdb.IOException("disk on fire")

        monkeypatch.setattr(openbuckets, "fold", broken)
        with pytest.raises(store_mod.StoreError, match="disk on fire"):
            s.flush()
        monkeypatch.setattr(openbuckets, "fold", real)
        s.append([block("r", 0, range(21, 31), ("loss",))])
        s.flush()
        assert s.seen_seqs() == [("r", 0, 0, 1, 30)]
        values = s.series("r", "loss")[0]["value"]
        np.testing.assert_array_equal(
            values, [math.nan if q == 17 else q + 0.0 for q in range(1, 31)]
        )


def test_pending_counts_records_blocks_and_bulk_columns_until_flushed(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as s:
        s.append([block("r", 0, range(1, 41), ("loss",)), Heartbeat("r", 1, 1, 1e9, None, 5, 0)])
        s.append_steps("r", "loss", np.array([2, 3]), np.array([0, 0]), np.array([0.5, 0.6]))
        assert s.pending() == 40 + 1 + 2
        s.flush()
        assert s.pending() == 0
