"""The aggregator's fast frame decoder gives exactly what the wire schema's decoder gives.

Pure. ``frames.decode_frame_blocks`` must return the same records as
``records.decode_frame_blocks`` (and so as ``decode_frame``) for every frame, or raise the same
``DecodeError``; and it must take the agent's usual batch itself, or it is no faster.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import (
    SCHEMA_VERSION,
    Heartbeat,
    StepBlock,
    StepRecord,
    encode_frame,
    to_wire,
)
from rankwatch.aggregator.ingest import frames

from tests.agent.test_records_blocks import outcome, rec
from tests.agent.test_records_fast import _DROP, FIELDS, METRIC_MAPS, ODD


def frame(raws: Any, v: Any = SCHEMA_VERSION, **extra: Any) -> bytes:
    return msgpack.packb({"v": v, "records": raws, **extra}, use_bin_type=True)


def same_as_schema(data: bytes) -> bool:
    """Assert both decoders agree on ``data``; True when the fast path took it itself."""
    assert outcome(frames.decode_frame_blocks, data) == outcome(records.decode_frame, data)
    return frames.decode_fast(data) is not None


def is_block(data: bytes) -> bool:
    out = frames.decode_fast(data)
    return out is not None and len(out) == 1 and isinstance(out[0], StepBlock)


def test_the_agents_batch_takes_the_fast_path() -> None:
    raws = [rec(s) for s in range(1, 101)]
    assert same_as_schema(frame(raws)) and is_block(frame(raws))
    (block,) = frames.decode_frame_blocks(frame(raws))
    assert block == records.decode_frame_blocks(frame(raws))[0]
    assert block.records() == records.decode_frame(frame(raws))
    # what the agent's encoder writes, NaN and no metrics included
    nan = [StepRecord("r", 0, s, 1e9 + s, 8, "h", 7, s, None, {"loss": math.nan}) for s in (1, 2)]
    assert same_as_schema(encode_frame(nan)) and is_block(encode_frame(nan))
    bare = [StepRecord("r", 0, s, 1e9 + s, 8, "h", 7, s, None, {}) for s in (1, 2)]
    assert same_as_schema(encode_frame(bare)) and is_block(encode_frame(bare))
    # an incarnation's batch: one block of it
    inc = [StepRecord("r", 0, s, 1e9 + s, 8, "h", 7, s, None, {}, 2**53 - 1) for s in (1, 2)]
    assert same_as_schema(encode_frame(inc)) and is_block(encode_frame(inc))
    assert frames.decode_frame_blocks(encode_frame(inc))[0].inc == 2**53 - 1


def _packable(value: Any) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**64


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [v for v in ODD if _packable(v)], ids=repr)
@pytest.mark.parametrize("at", [0, 3, None])  # None: every record
def test_one_odd_field(field: str, value: Any, at: int | None) -> None:
    raws = [rec(s) for s in range(1, 6)]
    for raw in raws if at is None else [raws[at]]:
        if value is _DROP:
            raw.pop(field, None)  # inc is optional
        else:
            raw[field] = value
    same_as_schema(frame(raws))


@pytest.mark.parametrize("metrics", METRIC_MAPS, ids=lambda m: repr(m)[:40])
@pytest.mark.parametrize("at", [0, 2, None])
def test_odd_metric_maps(metrics: dict, at: int | None) -> None:
    raws = [rec(s) for s in range(1, 5)]
    for raw in raws if at is None else [raws[at]]:
        raw["metrics"] = dict(metrics)
    same_as_schema(frame(raws))


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.update(rank=3),
        lambda r: r.update(run="run-2"),
        lambda r: r.update(pid=99),
        lambda r: r.update(host="node1"),
        lambda r: r.update(world_size=8),
        lambda r: r["metrics"].update(acc=0.5),
        lambda r: r["metrics"].pop("lr"),
        lambda r: r.update(metrics={"loss": 1.0, "acc": 2.0}),
        lambda r: r.update(metrics={"lr": 5.0, "loss": 7.0}),  # same names, other order
        lambda r: r.update(kind="heartbeat"),
        lambda r: r.update(epoch=None),
        lambda r: r.update(inc=7),  # another incarnation: not one block
        lambda r: r.update(inc=0),  # incarnation 0 spelled out: the same as none
        lambda r: r.update(seq=1),
        lambda r: r.update(time=7),  # an int time: converted, in both
        lambda r: r["metrics"].update(loss=3),  # an int value: converted, in both
        lambda r: r["metrics"].update(loss=2**64 - 1),
        lambda r: r.update(extra={"unknown": "field"}),  # ignored by the schema: slow path
        lambda r: r.update(extra=b"bytes"),  # the schema refuses binary anywhere
        lambda r: r.update(extra={1: 2}),  # ... and map keys that are not strings
    ],
)
def test_a_record_unlike_the_first(change: Any) -> None:
    raws = [rec(s) for s in range(1, 6)]
    change(raws[2])
    same_as_schema(frame(raws))


@pytest.mark.parametrize(
    "data",
    [
        frame([rec(1), rec(2)], v=SCHEMA_VERSION + 1),
        frame([rec(1), rec(2)], v=0),
        frame([rec(1), rec(2)], v=True),
        frame([rec(1), rec(2)], extra=1),  # an unknown envelope field
        frame("not a list"),
        msgpack.packb([1, 2]),
        b"\xc1",  # never used in msgpack
        b"",
        frame([rec(1), rec(2)])[:-3],  # truncated
    ],
    ids=repr,
)
def test_odd_envelopes(data: bytes) -> None:
    assert not same_as_schema(data)


def _beat(rank: int, seq: int, **extra: Any) -> dict[str, Any]:
    return to_wire(Heartbeat("run-1", rank, seq, 1.5e9 + seq, seq - 1, 5.0, 0, **extra))


def test_relay_frames_of_many_ranks_and_heartbeats_take_the_fast_path_record_by_record() -> None:
    relay = [rec(s) for s in (1, 2)] + [{**rec(3), "rank": r} for r in range(3, 7)]
    relay += [_beat(9, 4), _beat(2, 5, paused="checkpoint"), {**_beat(3, 6), "paused": None}]
    one_beat = _beat(1, 1)
    del one_beat["last_step"]  # optional: None
    for raws in (relay, [rec(1)], [one_beat], []):
        assert same_as_schema(frame(raws)) and not is_block(frame(raws))
    out = frames.decode_frame_blocks(frame(relay))
    assert [type(r).__name__ for r in out] == ["StepRecord"] * 6 + ["Heartbeat"] * 3
    assert out[-2].paused == "checkpoint" and out[-1].last_step == 5
    event = {**rec(8), "kind": "event", "event": "note", "info": {"a": [1, {"b": 2}]}}
    assert not same_as_schema(frame([*relay, event]))  # events: the schema's decoder


@pytest.mark.parametrize(
    "field", ["run", "rank", "seq", "time", "last_step", "next_in", "dropped", "paused", "inc"]
)
@pytest.mark.parametrize("value", [v for v in ODD if _packable(v)], ids=repr)
def test_one_odd_heartbeat_field(field: str, value: Any) -> None:
    raws = [rec(1), _beat(2, 2), _beat(3, 3)]
    if value is _DROP:
        raws[1].pop(field, None)
    else:
        raws[1][field] = value
    same_as_schema(frame(raws))


def test_oversized_frames_are_refused_as_before() -> None:
    raws = [rec(s) for s in range(1, 3)]
    raws[0]["metrics"] = {f"m{i}": 1.0 for i in range(1000)}
    big = frame(raws, pad="x" * records.MAX_FRAME_BYTES)
    assert outcome(frames.decode_frame_blocks, big)[0] == "size"
    same_as_schema(big)


def test_a_repeated_key_means_what_msgpack_makes_of_it() -> None:
    # Packed by hand: a record map holding "seq" twice (msgpack-python keeps the last).
    def raw_map(pairs: list[tuple[str, Any]]) -> bytes:
        out = bytearray(b"\xde" + struct.pack(">H", len(pairs)))
        for key, value in pairs:
            out += msgpack.packb(key) + msgpack.packb(value, use_bin_type=True)
        return bytes(out)

    records_ = [list(rec(s).items()) for s in (1, 2)]
    records_[1].append(("seq", 9))
    body = b"\x92" + b"".join(raw_map(r) for r in records_)
    data = b"\x82" + msgpack.packb("v") + msgpack.packb(SCHEMA_VERSION)
    data += msgpack.packb("records") + body
    same_as_schema(data)


_value = st.one_of(
    st.floats(allow_nan=True),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([None, True, "NaN", "", b"x", [], {}]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "kind": st.sampled_from(["step", "step", "heartbeat", "event", "x"]),
                "run": st.sampled_from(["r", "", "r2"]) | st.text(max_size=3),
                "rank": st.integers(-1, 3) | _value,
                "seq": st.integers(-1, 5) | _value,
                "time": st.floats(allow_nan=True) | _value,
                "world_size": st.integers(0, 4) | _value,
                "host": st.sampled_from(["h", ""]) | _value,
                "pid": st.integers(-1, 3) | _value,
                "step": _value,
                "epoch": _value,
                "metrics": st.dictionaries(st.sampled_from(["a", "b", ""]), _value, max_size=3)
                | _value,
                "last_step": _value,
                "next_in": st.floats(allow_nan=True) | _value,
                "dropped": st.integers(-1, 3) | _value,
                "paused": st.sampled_from([None, "ckpt"]) | _value,
                "extra": _value,
            },
        ),
        max_size=4,
    )
)
def test_random_frames(raws: list[dict[str, Any]]) -> None:
    same_as_schema(frame(raws))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(allow_nan=True, width=32) | st.floats(allow_nan=True), min_size=2),
    st.integers(0, 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
)
def test_valid_batches_are_blocks_with_the_same_values(
    losses: list[float], rank: int, first_step: int
) -> None:
    raws = [
        to_wire(StepRecord("r", rank, i + 1, 1.0 * i, 8, "h", 1, first_step, i, {"loss": v}))
        for i, v in enumerate(losses)
    ]
    assert same_as_schema(frame(raws)) and is_block(frame(raws))


def test_the_msgspec_structs_hold_the_defined_fields() -> None:
    """The fast path's struct is written out; it must be the schema's one definition."""
    fields = msgspec.structs.fields(frames._Step)
    assert [(f.name, f.type, f.required) for f in fields] == [
        (spec.name, spec.type, spec.required) for spec in records.STEP_FIELDS
    ]
    beat = {f.name for f in msgspec.structs.fields(frames._Beat)}
    common = {"run", "rank", "seq", "time", "inc"}
    assert common <= beat and common <= {spec.name for spec in records.STEP_FIELDS}
