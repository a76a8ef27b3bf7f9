"""The seq intervals in memory (store/seen.py): the merge rule against a set of seqs, and the
store's ``seen_seqs()`` against the union of every stored seq, recomputed in SQL from the raw
tables, after flushes, after close and reopen, and after the store is dropped without close."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import numpy as np
import pytest
from rankwatch.agent.wire.records import EventRecord, Heartbeat, Record, StepBlock, StepRecord
from rankwatch.aggregator.store import seen
from rankwatch.aggregator.store.db import Store


def intervals(seqs: set[int]) -> list[tuple[int, int]]:
    """The one obvious way: sorted seqs cut where one is not the last plus one."""
    out: list[list[int]] = []
    for q in sorted(seqs):
        if out and q == out[-1][1] + 1:
            out[-1][1] = q
        else:
            out.append([q, q])
    return [(lo, hi) for lo, hi in out]


def test_merge_is_the_union_of_the_intervals_per_key() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 40)
        keys = [rng.randint(0, 4) for _ in range(n)]
        los = [rng.randint(-3, 60) for _ in range(n)]
        his = [lo + rng.choice([0, 0, 1, 2, 5, 20]) for lo in los]
        want = []
        for k in sorted(set(keys)):
            seqs = {q for kk, lo, hi in zip(keys, los, his, strict=True) if kk == k
                    for q in range(lo, hi + 1)}  # fmt: skip
            want += [(k, lo, hi) for lo, hi in intervals(seqs)]
        key, lo, hi = seen.merge(np.array(keys), np.array(los), np.array(his))
        assert list(zip(key.tolist(), lo.tolist(), hi.tolist(), strict=True)) == want


def test_merge_keeps_keys_apart_and_joins_touching_intervals() -> None:
    key, lo, hi = seen.merge(np.array([1, 0, 1, 0, 2]), np.array([4, 1, 1, 10, 5]),
                             np.array([6, 3, 3, 12, 5]))  # fmt: skip
    assert key.tolist() == [0, 0, 1, 2]
    assert lo.tolist() == [1, 10, 1, 5]
    assert hi.tolist() == [3, 12, 6, 5]


def test_added_snapshots_are_never_changed() -> None:
    first = seen.SeenSeqs()
    a, b = first.code("r", 0, 0), first.code("r", 1, 0)
    one = first.added((np.array([a, b]), np.array([1, 1]), np.array([5, 2])), 2)
    two = one.added((np.array([a]), np.array([6]), np.array([9])), 3)
    assert one.rows() == [("r", 0, 0, 1, 5), ("r", 1, 0, 1, 2)]
    assert two.rows() == [("r", 0, 0, 1, 9), ("r", 1, 0, 1, 2)]
    assert len(first) == 0 and (one.logged, two.logged) == (2, 3)


# The merged seqs recomputed from the raw tables (every record below is a step, an event or a
# heartbeat, each of which keeps its seq), with the gaps-and-islands the flush used to run.
_FROM_RAW = """
WITH u AS (SELECT DISTINCT run, rank, inc, seq FROM (
    SELECT run, rank, inc, seq FROM steps UNION ALL SELECT run, rank, inc, seq FROM events
    UNION ALL SELECT run, rank, inc, seq FROM heartbeats)),
g AS (SELECT *, seq - row_number() OVER (PARTITION BY run, rank, inc ORDER BY seq) AS island
      FROM u)
SELECT run, rank, inc, min(seq), max(seq) FROM g GROUP BY run, rank, inc, island
ORDER BY run, rank, inc, min(seq)
"""


def _from_raw(s: Store) -> list[tuple]:
    with s._query() as cur:
        return cur.execute(_FROM_RAW).fetchall()


def _logged(path: Path) -> list[tuple]:
    con = duckdb.connect(str(path))
    try:
        return con.execute("SELECT run, rank, inc, lo, hi FROM seqs").fetchall()
    finally:
        con.close()


def _flushes(rng: random.Random, n: int) -> list[list[Record]]:
    """Records of 2 runs x 6 ranks x 2 incarnations in random order: gaps, repeats (a resend of
    what was stored), blocks of consecutive seqs, events and heartbeats."""
    out = []
    for _ in range(n):
        items: list[Record | StepBlock] = []
        for _ in range(rng.randint(1, 30)):
            run, rank, inc = rng.choice("ab"), rng.randint(0, 5), rng.choice([0, 0, 3])
            q = rng.randint(1, 80)
            kind = rng.random()
            if kind < 0.5:
                items.append(StepRecord(run, rank, q, 1.0 + q, 4, "h", 1, q, None,
                                        {"loss": q * 0.5}, inc))  # fmt: skip
            elif kind < 0.7:
                seqs = list(range(q, q + rng.randint(1, 12)))
                items.append(StepBlock(run, rank, 4, "h", 1, seqs, [1.0 + x for x in seqs],
                                       list(seqs), [None] * len(seqs),
                                       {"loss": [x * 0.5 for x in seqs]}, inc))  # fmt: skip
            elif kind < 0.85:
                items.append(EventRecord(run, rank, q, 1.0 + q, 4, "h", 1, "start", None, {},
                                         inc))  # fmt: skip
            else:
                items.append(Heartbeat(run, rank, q, 1.0 + q, None, 5.0, 0, inc=inc))
        out.append(items)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seen_seqs_equal_the_raw_tables_after_flushes_reopen_and_a_kill(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seen, "COMPACT_MIN_ROWS", 40)  # compactions among the flushes too
    rng = random.Random(seed)
    path = tmp_path / "s.duckdb"
    flushes = _flushes(rng, 30)
    s = Store(path)
    for i, items in enumerate(flushes):
        s.append(items)
        s.flush()
        assert s.seen_seqs() == _from_raw(s), i
        if i == 10:  # closed and opened again: the log merged on disk
            held = s.seen_seqs()
            s.close()
            assert sorted(_logged(path)) == held
            s = Store(path)
            assert s.seen_seqs() == held
            assert s.seen_seqs() == _from_raw(s)
        if i == 20:  # dropped without close, as a kill -9 leaves it: the log as flushed
            s._reads.close()
            s._writer.close()
            s._con.close()
            s = Store(path)
            assert s.seen_seqs() == _from_raw(s)
    held = s.seen_seqs()
    s.close()
    assert sorted(_logged(path)) == held
    with Store(path) as s:
        assert s.seen_seqs() == _from_raw(s) == held


def test_the_log_is_compacted_once_it_holds_twice_the_merged_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seen, "COMPACT_MIN_ROWS", 10)
    with Store(tmp_path / "s.duckdb") as s:
        sizes = []
        for q in range(1, 31):  # one rank, one record per flush: one interval, a row a flush
            s.append([StepRecord("r", 0, q, 1.0, 1, "h", 1, q, None, {"loss": 1.0})])
            s.flush()
            with s._query() as cur:
                row = cur.execute("SELECT count(*) FROM seqs").fetchone()
            sizes.append(row[0] if row else None)
            assert s.seen_seqs() == [("r", 0, 0, 1, q)]
        assert max(sizes) == 10 and sizes[10] == 1  # the 11th flush rewrote it merged
