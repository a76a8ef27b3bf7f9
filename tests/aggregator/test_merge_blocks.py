"""Whole blocks through dedupe, merge and the live feed give what their records give one by one.

Pure, seeded: the same random traffic (interleaved ranks, repeats, gaps, late steps, blocks
that overlap what was seen) goes through the record path and the block path; every output and
every counter must match.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from rankwatch.agent.wire.records import Heartbeat, StepBlock, StepRecord, unblock
from rankwatch.aggregator.dedupe import as_blocks
from rankwatch.aggregator.feed import points_messages
from rankwatch.aggregator.merge import StepGrid, StepMerger, StepValues
from rankwatch.aggregator.seqs import SeqTracker


def flat(groups: list[StepValues | StepGrid]) -> list[StepValues]:
    return [sv for g in groups for sv in (g.step_values() if isinstance(g, StepGrid) else [g])]


def block(run: str, rank: int, seqs: list[int], steps: list[int], ws: int = 4) -> StepBlock:
    loss = [1.0 + 0.01 * rank + (math.nan if s % 17 == 5 else 0.0) for s in steps]
    return StepBlock(
        run, rank, ws, f"node{rank}", 100 + rank, seqs, [1e9 + s for s in seqs], steps,
        [s // 10 for s in steps], {"loss": loss, "lr": [3e-4] * len(seqs)},
    )  # fmt: skip


def traffic(seed: int) -> list[StepBlock]:
    """Blocks of 4 ranks, steps in order with some resends, overlaps and late blocks."""
    rng = random.Random(seed)
    nxt = dict.fromkeys(range(4), 1)
    out = []
    for _ in range(60):
        rank = rng.randrange(4)
        size = rng.randint(1, 12)
        lo = nxt[rank]
        if rng.random() < 0.15:
            lo = max(1, lo - rng.randint(1, 20))  # a resend overlapping what was sent
        elif rng.random() < 0.1:
            lo += rng.randint(1, 5)  # a gap
        seqs = list(range(lo, lo + size))
        if rng.random() < 0.05:
            seqs[1:3] = seqs[2:0:-1][:2] if size > 3 else seqs[1:3]  # out of order inside
        nxt[rank] = max(nxt[rank], max(seqs) + 1)
        out.append(block("r", rank, seqs, [s - 1 for s in seqs]))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_blocks_dedupe_and_merge_as_their_records_do(seed: int) -> None:
    seqs_a, seqs_b = SeqTracker(), SeqTracker()
    merge_a = StepMerger(grace_s=1.0, max_step_window=30, max_open_steps=25)
    merge_b = StepMerger(grace_s=1.0, max_step_window=30, max_open_steps=25)
    for i, blk in enumerate(traffic(seed)):
        now = float(i)
        recs = blk.records()
        fresh = [seqs_a.accept(r.run, r.rank, r.seq) for r in recs]
        want = [sv for r, ok in zip(recs, fresh, strict=True) if ok for sv in merge_a.add(r, now)]
        mask = seqs_b.accept_many(blk.run, blk.rank, blk.seq)
        assert (mask is None) == all(fresh) and (mask is None or mask == fresh)
        if mask is None:
            got = flat(merge_b.add_block(blk, now))
        else:  # a resend overlapping what arrived: its new records go one by one (the service)
            fresh_b = [blk.record(i) for i, ok in enumerate(mask) if ok]
            got = [sv for r in fresh_b for sv in merge_b.add(r, now)]
        assert [repr(sv) for sv in got] == [repr(sv) for sv in want]
        assert [repr(sv) for sv in flat(merge_b.expire(now))] == [
            repr(sv) for sv in merge_a.expire(now)
        ]
    for rank in range(4):
        assert seqs_a.intervals("r", rank) == seqs_b.intervals("r", rank)
    assert (merge_a.late, merge_a.evicted) == (merge_b.late, merge_b.evicted)
    assert merge_a.open_groups() == merge_b.open_groups()


def test_a_fresh_consecutive_block_is_one_interval_update() -> None:
    seqs = SeqTracker()
    assert seqs.accept_many("r", 0, [1, 2, 3]) is None
    assert seqs.accept_many("r", 0, list(range(4, 1004))) is None
    assert seqs.intervals("r", 0) == [(1, 1003)]
    assert seqs.accept_many("r", 0, [1003, 1004, 1005]) == [False, True, True]
    assert seqs.accept_many("r", 0, [1010, 1011]) is None
    assert seqs.gaps("r", 0) == [(1006, 1009)]
    assert seqs.accept_many("r", 0, []) is None


def test_a_metric_less_block_opens_its_steps_like_records_do() -> None:
    a, b = StepMerger(), StepMerger()
    blk = StepBlock("r", 0, 2, "h", 1, [1, 2], [1.0, 2.0], [5, 6], [None, None], {})
    for rec in blk.records():
        a.add(rec, 0.0)
    b.add_block(blk, 0.0)
    assert a.open_groups() == b.open_groups() == 2


@pytest.mark.parametrize("max_points", [1_000_000, 50, 7, 1])
def test_feed_points_of_blocks_are_those_of_their_records(max_points: int) -> None:
    blocks = [block("r", rank, list(range(1, 31)), list(range(30))) for rank in range(3)]
    single = StepRecord("r", 3, 1, 1e9, 4, "h", 1, 0, 0, {"loss": math.inf, "acc": 0.5})
    items: list[StepRecord | StepBlock] = [blocks[0], single, blocks[1], blocks[2]]
    flat = unblock(items)
    assert points_messages(items, max_points) == points_messages(flat, max_points)


def mixed_traffic(seed: int) -> list[tuple[StepBlock, bool]]:
    """Blocks with differing metric sets, some to be added record by record on both sides."""
    rng = random.Random(seed)
    sets = [("loss", "lr"), ("loss", "lr"), ("loss",), ("lr", "loss"), ("acc", "loss"), ()]
    out = []
    nxt = dict.fromkeys(range(3), 1)
    for _ in range(50):
        rank = rng.randrange(3)
        size = rng.randint(1, 6)
        lo = nxt[rank] if rng.random() > 0.2 else max(1, nxt[rank] - rng.randint(1, 4))
        seqs = list(range(lo, lo + size))
        nxt[rank] = max(nxt[rank], lo + size)
        names = rng.choice(sets)
        steps = [s - 1 for s in seqs]
        metrics = {m: [float(rank + 10 * j + s) for s in steps] for j, m in enumerate(names)}
        blk = StepBlock("r", rank, 3, "h", 1, seqs, [1e9 + s for s in seqs], steps,
                        [None] * size, metrics)  # fmt: skip
        out.append((blk, rng.random() < 0.3))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_blocks_of_differing_metrics_mixed_with_records_merge_as_records_do(seed: int) -> None:
    a = StepMerger(grace_s=2.0, max_step_window=20, max_open_steps=15)
    b = StepMerger(grace_s=2.0, max_step_window=20, max_open_steps=15)
    for i, (blk, as_records) in enumerate(mixed_traffic(seed)):
        now = float(i)
        want = [sv for r in blk.records() for sv in a.add(r, now)]
        if as_records:
            got = [sv for r in blk.records() for sv in b.add(r, now)]
        else:
            got = flat(b.add_block(blk, now))
        assert [repr(sv) for sv in got] == [repr(sv) for sv in want], i
        assert [repr(sv) for sv in flat(b.expire(now))] == [repr(sv) for sv in a.expire(now)]
    assert (a.late, a.evicted, a.open_groups()) == (b.late, b.evicted, b.open_groups())


def test_as_blocks_gathers_each_ranks_step_records_in_order_between_other_records() -> None:
    def rec(rank: int, seq: int, pid: int = 1, **metrics: float) -> StepRecord:
        return StepRecord("r", rank, seq, 1e9 + seq, 4, "h", pid, seq, None,
                          metrics or {"loss": float(seq), "lr": 0.1})  # fmt: skip

    hb = Heartbeat("r", 0, 5, 1e9, 4, 5.0, 0)
    items = [rec(0, 1), rec(1, 1), rec(0, 2), rec(1, 2), rec(0, 3), hb, rec(0, 6), rec(1, 3),
             rec(0, 7, pid=2), rec(0, 8, pid=2), rec(1, 4, lr=0.1, loss=4.0),
             rec(1, 5)]  # fmt: skip
    out = as_blocks(items)
    shape = [(type(i).__name__, i.rank, i.seq if isinstance(i, StepBlock) else [i.seq])
             for i in out]  # fmt: skip
    assert shape == [
        ("StepBlock", 0, [1, 2, 3]),
        ("StepBlock", 1, [1, 2]),
        ("Heartbeat", 0, [5]),
        ("StepRecord", 0, [6]),  # rank 0's next process (pid 2) starts a block of its own
        ("StepRecord", 1, [3]),
        ("StepRecord", 1, [4]),  # metric order changes twice
        ("StepBlock", 0, [7, 8]),
        ("StepRecord", 1, [5]),
    ]
    flat = unblock(out)
    for rank in (0, 1):  # every rank's records, each once, in its own order
        assert [r for r in flat if r.rank == rank] == [r for r in items if r.rank == rank]


def verdicts(results: list[Any]) -> list[tuple[str, list[tuple[int, str]], str, str]]:
    """Each step's statistics, every rank's score, what it flagged and resolved, as text."""
    out = []
    for res in results:
        for r in res.results() if hasattr(res, "results") else [res]:
            scores = sorted((rank, repr(score)) for rank, score in r.scores.items())
            out.append((repr(r.stats), scores, repr(r.new), repr(r.resolved)))
    return out


@pytest.mark.parametrize(("world", "seed"), [(8, 0), (64, 1), (4096, 2)])
def test_partial_steps_of_relay_blocks_score_as_their_values_do(world: int, seed: int) -> None:
    """A step a rank never reached, handed out by ``expire`` as a one-step grid of the blocks'
    rows, gives the detector the verdicts and state the same step as per-metric values gives,
    at a small, a middling and a large world (its numpy path)."""
    from rankwatch.agent.wire.records import RanksBlock
    from rankwatch.aggregator.divergence.detector import DivergenceDetector

    rng = random.Random(seed)
    merger = StepMerger(grace_s=1.0)
    grids, values = DivergenceDetector(), DivergenceDetector()
    missing, bad = world - 1, 3  # a hung rank; a drifting one from step 30
    flagged: set[tuple[int, str]] = set()
    for step in range(60):
        for lo in range(0, world, 8):
            ranks = [r for r in range(lo, min(world, lo + 8)) if r != missing]
            n = len(ranks)
            loss = [rng.gauss(2.0, 0.05) + (0.5 if r == bad and step >= 30 else 0.0)
                    for r in ranks]  # fmt: skip
            block = RanksBlock(
                "r", world, ranks, [step + 1] * n, [0.0] * n, ["h"] * n, [1] * n, [step] * n,
                [None] * n, {"loss": loss, "grad_norm": [rng.gauss(1.0, 0.1) for _ in ranks]},
                [0] * n,
            )  # fmt: skip
            assert merger.add_ranks(block, float(step)) == []  # never complete
        out = merger.expire(float(step) + 1.0)  # this step, past its grace
        assert [(type(g), g.steps, len(g.ranks)) for g in out] == [(StepGrid, [step], world - 1)]
        want = values.update_many(flat(out))
        got = grids.update_many(out)
        assert verdicts(got) == verdicts(want), step
        flagged |= {(d.rank, d.metric) for r in got for d in getattr(r, "new", [])}
    assert (bad, "loss") in flagged and merger.late == 0
