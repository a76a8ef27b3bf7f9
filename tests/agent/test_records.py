"""The wire schema: round trips and every way a record or frame can be wrong. Pure, no I/O."""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest
from rankwatch.agent.wire.records import (
    BASE_VERSION,
    MAX_FRAME_BYTES,
    MAX_METRICS,
    MAX_NAME_CHARS,
    DecodeError,
    EventRecord,
    Heartbeat,
    Record,
    StepRecord,
    decode_frame,
    decode_record,
    encode_frame,
    from_json_line,
    json_value,
    to_json_line,
    to_wire,
)

STEP = StepRecord("run-1", 2, 10, 1_795_988_026.5, 4, "node0", 1234, 99, 3, {"loss": 0.5})
EVENT = EventRecord("run-1", 2, 11, 1.5, 4, "node0", 1234, "crash", None, {"message": "x"})
BEAT = Heartbeat("run-1", 2, 12, 2.5, 99, 5.0, 0, "checkpoint")


def canon(rec: Record) -> str:
    return to_json_line(rec)  # NaN-safe equality


def step_with(**metrics: float) -> StepRecord:
    return StepRecord("r", 0, 1, 1.0, 1, "", 0, 1, None, metrics)


@pytest.mark.parametrize(
    "rec",
    [
        STEP,
        EVENT,
        BEAT,
        Heartbeat("r", 0, 1, 0.0, None, math.inf, 3, None),
        step_with(a=math.nan, b=math.inf, c=-math.inf, d=-0.0, e=5e-324, f=1.7976931348623157e308),
        step_with(**{"ü/x y": 1.0, "a" * MAX_NAME_CHARS: 2.0}),
        StepRecord("r", 0, 1, 1.0, 1, "h", 0, -5, None, {}),
        StepRecord("r", 0, 2**63 - 1, 1.0, 1, "h", 0, 2**63 - 1, None, {}),
        EventRecord("r", 0, 1, 1.0, 1, "h", 0, "eval", 7, {"nested": {"a": [1, "b", None]}}),
    ],
)
def test_round_trips(rec: Record) -> None:
    (through_frame,) = decode_frame(encode_frame([rec]))
    assert canon(through_frame) == canon(rec)
    assert canon(from_json_line(to_json_line(rec))) == canon(rec)
    assert canon(decode_record(to_wire(rec))) == canon(rec)


def test_frame_carries_a_batch_in_order() -> None:
    recs: list[Record] = [STEP, EVENT, BEAT]
    assert [r.seq for r in decode_frame(encode_frame(recs))] == [10, 11, 12]
    assert [r.seq for r in decode_frame(encode_frame([to_wire(r) for r in recs]))] == [10, 11, 12]


def test_nonfinite_anywhere_still_makes_strict_json() -> None:
    info = {"acc": math.nan, "deep": [{"x": math.inf}]}
    rec = EventRecord("r", 0, 1, math.nan, 1, "h", 0, "eval", None, info)
    raw = json.loads(to_json_line(rec), parse_constant=lambda c: pytest.fail(c))
    assert raw["info"] == {"acc": "NaN", "deep": [{"x": "Infinity"}]}
    assert math.isnan(from_json_line(to_json_line(rec)).time)


def test_json_lines_are_strict_json() -> None:
    line = to_json_line(step_with(a=math.nan, b=math.inf, c=-math.inf))
    assert line.endswith("\n") and line.count("\n") == 1
    raw = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard {c}"))
    assert raw["metrics"] == {"a": "NaN", "b": "Infinity", "c": "-Infinity"}
    assert raw["v"] == BASE_VERSION  # no telemetry in it: readable by version-1 aggregators


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.5, 1.5), (math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")],
)
def test_json_value(value: float, expected: float | str) -> None:
    assert json_value(value) == expected


def wire(rec: Record, **changes: Any) -> dict[str, Any]:
    out = to_wire(rec)
    for key, value in changes.items():
        if value is _DROP:
            del out[key]
        else:
            out[key] = value
    return out


_DROP = object()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([1, 2], "record is a list"),
        ({"kind": "metric"}, "field 'kind' is 'metric'"),
        ({}, "field 'kind' is None"),
        (wire(STEP, run=_DROP), "required field 'run' is missing"),
        (wire(STEP, run=""), "field 'run' is empty"),
        (wire(STEP, run="x" * (MAX_NAME_CHARS + 1)), "max 256"),
        (wire(STEP, run=5), "field 'run' must be a string, got int"),
        (wire(STEP, rank=-1), "field 'rank' is -1, must be >= 0"),
        (wire(STEP, rank=True), "field 'rank' must be an int, got bool"),
        (wire(STEP, rank=1.0), "field 'rank' must be an int, got float"),
        (wire(STEP, seq=0), "field 'seq' is 0, must be >= 1"),
        (wire(STEP, seq=2**63), "out of the 64-bit range"),
        (wire(STEP, time="now"), "field 'time' must be a number, got str"),
        (wire(STEP, world_size=0), "field 'world_size' is 0"),
        (wire(STEP, host=None), "field 'host' must be a string"),
        (wire(STEP, pid=-3), "field 'pid' is -3"),
        (wire(STEP, step=_DROP), "required field 'step' is missing"),
        (wire(STEP, epoch="1"), "field 'epoch' must be an int"),
        (wire(STEP, metrics=_DROP), "required field 'metrics' is missing"),
        (wire(STEP, metrics=[1.0]), "must be a map"),
        (wire(STEP, metrics={"": 1.0}), "is not a valid name"),
        (wire(STEP, metrics={"a": "1.0"}), "metric 'a' must be a number, got str"),
        (wire(STEP, metrics={"a": None}), "got NoneType"),
        (wire(STEP, metrics={"a": True}), "got bool"),
        (wire(STEP, metrics={str(i): 1.0 for i in range(MAX_METRICS + 1)}), "max 1024"),
        (wire(EVENT, event="boot"), "field 'event' is 'boot'"),
        (wire(EVENT, info=[1]), "field 'info' must be a map"),
        (wire(BEAT, next_in=None), "field 'next_in' must be a number"),
        (wire(BEAT, dropped=-1), "field 'dropped' is -1"),
        (wire(BEAT, paused=1), "field 'paused' must be a string or null"),
        (wire(BEAT, last_step=1.5), "field 'last_step' must be an int"),
    ],
)
def test_decode_record_errors(raw: Any, message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(")) as info:
        decode_record(raw)
    assert info.value.reason == "field"


@pytest.mark.parametrize(
    ("frame", "reason", "message"),
    [
        (b"\xc1", "msgpack", "not a msgpack frame"),
        (msgpack.packb([1]), "envelope", "frame is a list"),
        (msgpack.packb({"records": []}), "envelope", "'v' missing"),
        (msgpack.packb({"v": "1", "records": []}), "envelope", "not an int"),
        (msgpack.packb({"v": 3, "records": []}), "version", "newer than this aggregator"),
        (msgpack.packb({"v": 0, "records": []}), "version", "not valid"),
        (msgpack.packb({"v": 1}), "envelope", "no 'records' list"),
        (msgpack.packb({"v": 1, "records": [{"kind": "x"}]}), "field", "'kind'"),
        (b"\x00" * (MAX_FRAME_BYTES + 1), "size", "exceeds"),
    ],
)
def test_decode_frame_errors(frame: bytes, reason: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message) as info:
        decode_frame(frame)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "json"),
        ("[1]", "field"),
        ('{"kind":"step"}', "envelope"),  # no version
        (to_json_line(STEP).replace('"v": 1', '"v": 9'), "version"),
    ],
)
def test_from_json_line_errors(line: str, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        from_json_line(line)
    assert info.value.reason == reason


def test_unknown_fields_are_ignored() -> None:
    raw = {**to_wire(STEP), "future_field": [1, 2]}
    assert canon(decode_record(raw)) == canon(STEP)


@pytest.mark.parametrize(
    ("value", "expected"), [("NaN", math.nan), ("Infinity", math.inf), (3, 3.0), (2.5, 2.5)]
)
def test_number_fields_accept_the_json_spellings(value: Any, expected: float) -> None:
    (rec,) = decode_frame(encode_frame([wire(BEAT, next_in=value)]))
    assert isinstance(rec, Heartbeat)
    assert rec.next_in == expected or (math.isnan(expected) and math.isnan(rec.next_in))
    assert type(rec.next_in) is float


def test_an_integer_too_large_for_a_float_is_a_field_error_naming_it() -> None:
    base = to_wire(StepRecord("r", 0, 1, 1.0, 1, "h", 1, 1, None, {"loss": 1.0}))
    for field, value in (("time", 10**400), ("metrics", {"loss": 10**400})):
        with pytest.raises(DecodeError, match="too large for a float") as info:
            decode_record({**base, field: value})
        assert info.value.reason == "field"


def test_msgpack_carries_no_integer_past_64_bits_and_the_largest_decodes_as_a_float() -> None:
    with pytest.raises(OverflowError):
        msgpack.packb(2**64)  # what an agent could never send
    top = 2**64 - 1
    wire = to_wire(StepRecord("r", 0, 1, 1.0, 1, "h", 1, 1, None, {"loss": 1.0}))
    (rec,) = decode_frame(encode_frame([{**wire, "time": top, "metrics": {"loss": top}}]))
    assert rec.time == float(top) and rec.metrics == {"loss": float(top)}
