"""A batched frame decodes into a StepBlock holding exactly what decode_frame decodes.

Pure. ``decode_frame_blocks`` must give a block only for frames of step records of one rank
and one metric set that the checked path accepts as they are; anything else (one odd field in
one record) must decode, or fail, exactly as ``decode_frame`` does.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest
from rankwatch.agent.wire.records import (
    SCHEMA_VERSION,
    DecodeError,
    StepBlock,
    StepRecord,
    decode_frame,
    decode_frame_blocks,
    encode_frame,
    to_json_line,
    to_wire,
    unblock,
)

from tests.agent.test_records_fast import _DROP, FIELDS, METRIC_MAPS, ODD


def rec(seq: int, **metrics: float) -> dict[str, Any]:
    m = metrics or {"loss": 1.0 / seq, "lr": 3e-4}
    return to_wire(StepRecord("run-1", 2, seq, 1.5e9 + seq, 4, "node0", 1234, seq * 10, 0, m))


def frame(raws: list[Any]) -> bytes:
    return msgpack.packb({"v": SCHEMA_VERSION, "records": raws}, use_bin_type=True)


def outcome(fn: Any, data: bytes) -> tuple[str, Any]:
    try:
        items = fn(data)
    except DecodeError as exc:
        return exc.reason, str(exc)
    flat = unblock(items)
    # metric order is not part of a record (a block keeps its first record's order)
    return "ok", [json.loads(to_json_line(r)) for r in flat]


def same_as_decode_frame(data: bytes) -> list[Any]:
    assert outcome(decode_frame_blocks, data) == outcome(decode_frame, data)
    try:
        return decode_frame_blocks(data)
    except DecodeError:
        return []


def test_a_uniform_batch_is_one_block_with_every_record() -> None:
    raws = [rec(s) for s in range(1, 101)]
    items = same_as_decode_frame(frame(raws))
    assert len(items) == 1 and isinstance(items[0], StepBlock)
    block = items[0]
    assert len(block) == 100 and block.seq == list(range(1, 101))
    assert block.metrics["loss"][9] == 0.1 and block.record(-1).seq == 100
    assert block.records() == decode_frame(frame(raws))


def _packable(value: Any) -> bool:
    """msgpack has no encoding for ints outside [-2**63, 2**64): they never come off the wire."""
    return not isinstance(value, int) or -(2**63) <= value < 2**64


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [v for v in ODD if _packable(v)], ids=repr)
@pytest.mark.parametrize("at", [0, 3])
def test_one_odd_field_in_one_record_decodes_as_decode_frame_does(
    field: str, value: Any, at: int
) -> None:
    raws = [rec(s) for s in range(1, 6)]
    if value is _DROP:
        raws[at].pop(field, None)  # inc is optional
    else:
        raws[at][field] = value
    same_as_decode_frame(frame(raws))


@pytest.mark.parametrize("metrics", METRIC_MAPS, ids=lambda m: repr(m)[:40])
@pytest.mark.parametrize("at", [0, 2])
def test_odd_metric_maps_decode_as_decode_frame_does(metrics: dict, at: int) -> None:
    raws = [rec(s) for s in range(1, 5)]
    raws[at]["metrics"] = metrics
    same_as_decode_frame(frame(raws))


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.update(rank=3),  # another rank
        lambda r: r.update(run="run-2"),
        lambda r: r.update(pid=99),  # a restarted process
        lambda r: r.update(host="node1"),
        lambda r: r.update(world_size=8),
        lambda r: r["metrics"].update(acc=0.5),  # one more metric
        lambda r: r["metrics"].pop("lr"),
        lambda r: r.update(metrics={"loss": 1.0, "acc": 2.0}),  # as many, other names
        lambda r: r.update(rank=2.0),  # equal to 2, but not an int
        lambda r: r.update(pid=float(r["pid"])),
        lambda r: r.update(world_size=True if r["world_size"] == 1 else 4.0),
        lambda r: r.update(kind="heartbeat"),
        lambda r: r.update(epoch=None),  # valid: None and ints mixed
        lambda r: r.update(seq=1),  # a repeated seq: a block, deduped later
        lambda r: r.update(extra={"unknown": "field"}),  # unknown fields are ignored
    ],
)
def test_a_record_unlike_the_first_decodes_as_decode_frame_does(change: Any) -> None:
    raws = [rec(s) for s in range(1, 6)]
    change(raws[2])
    same_as_decode_frame(frame(raws))


def test_values_keep_their_names_whatever_the_order_in_each_record() -> None:
    raws = [rec(s) for s in range(1, 4)]
    raws[1]["metrics"] = {"lr": 5.0, "loss": 7.0}
    (block,) = same_as_decode_frame(frame(raws))
    assert block.metrics == {"loss": [1.0, 7.0, 1 / 3], "lr": [3e-4, 5.0, 3e-4]}


def test_non_finite_values_and_no_metrics_are_blocks_too() -> None:
    raws = [rec(s, loss=math.nan if s == 2 else 1.0) for s in range(1, 4)]
    (block,) = same_as_decode_frame(frame(raws))
    assert math.isnan(block.metrics["loss"][1])
    empty = [rec(s) for s in range(1, 4)]
    for r in empty:
        r["metrics"] = {}
    (block,) = same_as_decode_frame(frame(empty))
    assert block.metrics == {} and len(block) == 3


def test_single_records_and_mixed_kinds_stay_records() -> None:
    one = encode_frame([rec(1)])
    assert [type(i) for i in decode_frame_blocks(one)] == [StepRecord]
    mixed = [rec(1), {**rec(2), "kind": "heartbeat", "last_step": 1, "next_in": 5.0,
                      "dropped": 0}]  # fmt: skip
    assert not any(isinstance(i, StepBlock) for i in same_as_decode_frame(frame(mixed)))
