"""A relay's frame of many ranks as one RanksBlock: decoded to the same records (each rank's in
its order), and taken by a real Aggregator (store, dedupe, restarts, health, merge, scores,
feed) to exactly the state the same frames give record by record. Pure but for the DuckDB
store in ``tmp_path``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import (
    DecodeError,
    Heartbeat,
    RanksBlock,
    StepRecord,
    encode_frame,
    to_json_line,
    to_wire,
    unblock,
)
from rankwatch.aggregator.ingest import frames
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.store.buffer import Batch

from tests.aggregator.store.test_store_blocks import contents

WORLD = 16
NODE = 8  # ranks per relay
METRICS = ("loss", "lr", "step_time", "grad_norm")


def step(rank: int, seq: int, s: int, *, inc: int = 7, run: str = "r", **extra: Any) -> StepRecord:
    # no two values alike: the stored rollups name the rank of a bucket's min and max
    metrics = {"loss": 2.0 / (s + 1) + rank * 1e-4, "lr": 1e-3 + rank * 1e-6 + s * 1e-8,
               "step_time": 0.2 + rank * 1e-4 + s * 1e-6,
               "grad_norm": 1.0 + rank * 0.01 + s * 1e-5}  # fmt: skip
    if rank == 4 and s >= 12:
        metrics["loss"] += 5.0  # one rank drifts: a divergence to find
    if rank == 7 and s == 9:
        metrics["loss"] = math.nan
    metrics.update(extra)
    made = 1e9 + s * 0.2 + rank * 1e-3 + (s * rank % 7) * 1e-3  # step intervals vary
    return StepRecord(run, rank, seq, made, WORLD, f"node{rank // NODE}", 1000 + rank, s, None,
                      metrics, inc)  # fmt: skip


def beat(rank: int, seq: int, s: int, inc: int = 7) -> Heartbeat:
    return Heartbeat("r", rank, seq, 1e9 + s * 0.2, s, 5.0, 0, None, inc)


def traffic() -> list[tuple[float, bytes]]:
    """Relay frames of a 16-rank run with what happens in one: heartbeats after steps, a hung
    rank (partial steps), a rank restarting (new incarnation, seqs from 1), a resend
    overlapping what arrived, a frame of two steps per rank, a late rank, a NaN."""
    out: list[tuple[float, bytes]] = []
    seq = dict.fromkeys(range(WORLD), 0)
    inc = dict.fromkeys(range(WORLD), 7)
    sent: list[list[Any]] = []
    for s in range(40):
        for node in range(WORLD // NODE):
            recs: list[Any] = []
            for rank in range(node * NODE, node * NODE + NODE):
                if rank == 15 and s < 5:
                    continue  # a late rank: its first records come at step 5
                if rank == 5 and 20 <= s < 30:
                    continue  # hangs for ten steps: those steps close partial
                if rank == 3 and s == 25:
                    inc[3], seq[3] = 99, 0  # restarted without its JSONL: new incarnation
                seq[rank] += 1
                recs.append(step(rank, seq[rank], s, inc=inc[rank]))
                if (s + rank) % 6 == 0:
                    seq[rank] += 1
                    recs.append(beat(rank, seq[rank], s, inc[rank]))
            sent.append(recs)
            out.append((1e9 + s * 0.2 + 0.05, encode_frame(recs)))
        if s == 30:  # a resend of a frame already taken, with one record never seen
            again = [r for r in sent[-6] if type(r) is StepRecord]
            again.append(step(12, 10_000, 30))
            out.append((1e9 + s * 0.2 + 0.1, encode_frame(again)))
    # two steps of every rank in one frame (a relay behind): no block, records as before
    two = [step(r, seq[r] + k, 40 + k, inc=inc[r]) for r in range(NODE) for k in (1, 2)]
    out.append((1e9 + 8.3, encode_frame(two)))
    return out


def by_rank(items: list[Any]) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for r in unblock(items):
        out.setdefault((r.run, r.rank), []).append(to_json_line(r))
    return out


def test_a_relay_frame_is_one_block_of_the_same_records_each_ranks_in_order() -> None:
    recs: list[Any] = [step(r, 10 + r, 3) for r in range(8)]
    recs.insert(3, beat(0, 40, 3))  # after its rank's step: the block goes first
    recs.append(beat(9, 50, 3))
    frame = encode_frame(recs)
    out = frames.decode_ranks(frame)
    assert out is not None and type(out[0]) is RanksBlock and len(out[0]) == 8
    assert [type(r) for r in out[1:]] == [Heartbeat, Heartbeat]
    assert by_rank(out) == by_rank(records.decode_frame(frame))
    assert frames.decode_frame_ranks(frame) == out
    # the old entries give what they gave: records in frame order
    assert frames.decode_frame_blocks(frame) == records.decode_frame(frame)


@pytest.mark.parametrize(
    "why",
    ["a rank twice", "heartbeat before its step", "two runs", "two world sizes",
     "other metric names", "one step only"],
)  # fmt: skip
def test_frames_a_block_cannot_hold_decode_record_by_record(why: str) -> None:
    recs: list[Any] = [step(r, 10 + r, 3) for r in range(4)]
    if why == "a rank twice":
        recs.append(step(0, 30, 4))
    elif why == "heartbeat before its step":
        recs.insert(0, beat(2, 5, 2))
    elif why == "two runs":
        recs[1] = step(1, 11, 3, run="other")
    elif why == "two world sizes":
        recs[1] = StepRecord(**{**_fields(recs[1]), "world_size": 8})
    elif why == "other metric names":
        recs[2] = step(2, 12, 3, extra=1.0)
    else:
        recs = [recs[0], beat(5, 3, 3)]
    frame = encode_frame(recs)
    out = frames.decode_ranks(frame)
    assert out is not None and not any(type(r) is RanksBlock for r in out)
    assert out == records.decode_frame(frame)


def _fields(rec: StepRecord) -> dict[str, Any]:
    return {k: getattr(rec, k) for k in rec.__slots__ if k != "kind"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("rank", 2**31), ("rank", -1), ("seq", 0), ("seq", 2**63), ("pid", -3), ("inc", 2**64 - 1),
     ("step", 2**63), ("host", "h" * 300), ("run", ""), ("world_size", 0)],
)  # fmt: skip
def test_a_bad_record_of_a_relay_frame_is_refused_as_the_schema_refuses_it(
    field: str, value: Any
) -> None:
    raws = [to_wire(step(r, 10 + r, 3)) for r in range(6)]
    raws[4][field] = value
    frame = msgpack.packb({"v": records.SCHEMA_VERSION, "records": raws}, use_bin_type=True)
    assert frames.decode_ranks(frame) is None  # the schema's decoder says what is wrong
    with pytest.raises(DecodeError) as want:
        records.decode_frame(frame)
    with pytest.raises(DecodeError) as got:
        frames.decode_frame_ranks(frame)
    assert (got.value.reason, str(got.value)) == (want.value.reason, str(want.value))


def test_a_malformed_block_is_refused_whole_with_its_reason(tmp_path: Path) -> None:
    good = frames.decode_ranks(encode_frame([step(r, 1, 0) for r in range(4)]))
    assert good is not None and type(good[0]) is RanksBlock
    block = good[0]
    short = RanksBlock(**{**_block_fields(block), "pids": block.pids[:3]})
    twice = RanksBlock(**{**_block_fields(block), "ranks": [0, 1, 1, 3]})
    agg = Aggregator(ServeConfig(data_dir=tmp_path, console_alerts=False))
    try:
        for bad, words in ((short, "column pids has 3 entries for 4 records"),
                           (twice, "a rank appears twice")):  # fmt: skip
            with pytest.raises(ValueError, match=words):
                agg.add([step(9, 1, 0), bad], imported=False, now=1e9)
            with pytest.raises(ValueError, match=words):
                Batch().extend([bad])
        assert agg.n["received"] == 0 and agg.seqs.max_seq("r", 9, 7) == 0  # nothing taken
    finally:
        agg.store.close()


def _block_fields(block: RanksBlock) -> dict[str, Any]:
    return {k: getattr(block, k) for k in block.__slots__}


def run_through(tmp_path: Path, decode: Any) -> dict[str, Any]:
    agg = Aggregator(ServeConfig(data_dir=tmp_path, console_alerts=False, merge_grace_s=1.0))
    page = agg.feed.subscribe(maxsize=10**6)
    blocks = 0
    messages: list[Any] = []
    next_tick = 1e9 + 0.5
    held: list[Any] = []  # a receiver's batch holds several frames: a rank's steps twice
    for i, (at, frame) in enumerate(traffic()):
        while at >= next_tick:
            agg.tick(next_tick)
            next_tick += 0.5
        items = decode(frame)
        blocks += sum(type(r) is RanksBlock for r in items)
        held += items
        if i % 5 < 3:
            agg.add(held, imported=False, now=at)
            held = []
    agg.add(held, imported=False, now=next_tick)
    agg.tick(next_tick + 10.0)
    messages = [json.dumps(m, sort_keys=True, default=str) for m in page.drain(10**6)]
    agg.store.flush()
    now = next_tick + 10.0
    seen = list(agg.seqs.keys())
    state = {
        "counters": dict(agg.n),
        "stored": contents(agg.store),
        "health": agg.health.snapshot(now),
        "changes": agg.health.changes(now),
        "late/evicted": (agg.merger.late, agg.merger.evicted, agg.merger.open_groups()),
        "values": agg.values,
        "z": {k: dict(v) for k, v in agg._z.items()},
        "seqs": {k: agg.seqs.intervals(*k[:2], k[2]) for k in seen},
        "restarts": (agg.restarts.restarts, agg.restarts.current("r", 3)),
        "feed": messages,
        "divergent": sorted(map(repr, agg.detector.active("r"))),
    }
    agg.store.close()
    return {"blocks": blocks, **state}


def test_relay_frames_as_blocks_leave_every_state_as_record_by_record(tmp_path: Path) -> None:
    want = run_through(tmp_path / "records", records.decode_frame)
    got = run_through(tmp_path / "blocks", frames.decode_frame_ranks)
    assert want.pop("blocks") == 0 and got.pop("blocks") >= 60  # the block path was taken
    assert got["restarts"] == (1, 99) and want["counters"]["duplicates"] >= 6
    assert want["divergent"] and any('"divergence"' in m for m in want["feed"])
    for part in want:
        assert got[part] == want[part], part
