"""Telemetry records on the wire (schema version 2): encode, decode, JSONL, the errors, and what
an aggregator of version 1 makes of a newer agent's frames."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import msgpack
import pytest
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import (
    BASE_VERSION,
    KINDS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_METRICS,
    MAX_SOURCE_CHARS,
    SCHEMA_VERSION,
    DecodeError,
    Heartbeat,
    StepRecord,
    TelemetryRecord,
    decode_frame,
    decode_record,
    encode_frame,
    frame_groups,
    from_json_line,
    to_json_line,
    to_wire,
)


def tele(seq: int = 3, **values: float) -> TelemetryRecord:
    return TelemetryRecord(
        "r", 5, seq, 1700000000.25, "node-1", 4242, "npu", "npu:5",
        values or {"npu/temp_c": 61.0, "npu/aicore_pct": 97.0},
        {"npu/health": "OK"}, inc=77,
    )  # fmt: skip


def step(seq: int = 1) -> StepRecord:
    return StepRecord("r", 5, seq, 1.0, 8, "node-1", 4242, seq, None, {"loss": 1.0}, 77)


def test_the_record_has_the_contracts_fields_in_order() -> None:
    names = [f.name for f in dataclasses.fields(TelemetryRecord)]
    assert names == [
        "run", "rank", "seq", "time", "host", "pid", "source", "device", "values", "labels",
        "inc", "kind",
    ]  # fmt: skip
    assert tele().kind == "telemetry" and "telemetry" in KINDS
    assert SCHEMA_VERSION == 2 and BASE_VERSION == 1


def test_a_frame_round_trips_with_version_2_and_non_finite_values() -> None:
    rec = tele(**{"gpu/temp_c": math.inf, "gpu/util_pct": math.nan, "gpu/power_w": 250.0})
    frame = encode_frame([rec])
    assert msgpack.unpackb(frame)["v"] == 2
    (got,) = decode_frame(frame)
    assert isinstance(got, TelemetryRecord)
    assert math.isnan(got.values["gpu/util_pct"]) and got.values["gpu/temp_c"] == math.inf
    assert dataclasses.replace(got, values={}) == dataclasses.replace(rec, values={})
    assert to_wire(got)["labels"] == {"npu/health": "OK"}


def test_frames_without_telemetry_keep_version_1_and_groups_split_it_off() -> None:
    assert msgpack.unpackb(encode_frame([step(1), step(2)]))["v"] == BASE_VERSION
    beat = to_wire(Heartbeat("r", 5, 4, 2.0, 1, 5.0, 0))
    wire = [to_wire(step(1)), to_wire(tele(2)), beat, to_wire(tele(5))]
    rest, telemetry = frame_groups(wire)
    assert [w["seq"] for w in rest] == [1, 4] and [w["seq"] for w in telemetry] == [2, 5]
    assert msgpack.unpackb(encode_frame(rest))["v"] == 1
    assert msgpack.unpackb(encode_frame(telemetry))["v"] == 2
    assert frame_groups(rest) == [rest] and frame_groups(telemetry) == [telemetry]


def test_an_aggregator_of_version_1_takes_the_steps_and_refuses_the_telemetry_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rest, telemetry = frame_groups([to_wire(step(1)), to_wire(tele(2))])
    steps, tele_frame = encode_frame(rest), encode_frame(telemetry)
    line = to_json_line(tele(2))
    monkeypatch.setattr(records, "SCHEMA_VERSION", 1)  # what an older aggregator checks against
    assert [r.seq for r in decode_frame(steps)] == [1]
    for refused in (lambda: decode_frame(tele_frame), lambda: from_json_line(line)):
        with pytest.raises(DecodeError) as info:
            refused()
        assert info.value.reason == "version"
        assert str(info.value) == (
            "schema version 2 is newer than this aggregator's 1: upgrade rankwatch on the head node"
        )


def test_jsonl_round_trips_in_strict_json() -> None:
    rec = tele(**{"host/cpu_pct": math.nan, "host/load1": -math.inf, "host/rss_bytes": 3e9})
    line = to_json_line(rec)
    raw = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard {c}"))
    assert raw["v"] == 2 and raw["kind"] == "telemetry"
    assert raw["values"] == {
        "host/cpu_pct": "NaN", "host/load1": "-Infinity", "host/rss_bytes": 3e9,
    }  # fmt: skip
    got = from_json_line(line)
    assert isinstance(got, TelemetryRecord)
    assert got.values["host/load1"] == -math.inf and math.isnan(got.values["host/cpu_pct"])
    assert (got.source, got.device, got.inc) == ("npu", "npu:5", 77)
    assert got.labels == {"npu/health": "OK"}
    assert json.loads(to_json_line(step()))["v"] == 1


def test_ints_in_values_become_floats_and_an_empty_device_is_host_wide() -> None:
    raw = to_wire(dataclasses.replace(tele(), device="", values={"host/load1": 2}))
    got = decode_record(raw)
    assert isinstance(got, TelemetryRecord)
    assert got.device == "" and got.values == {"host/load1": 2.0}
    assert type(got.values["host/load1"]) is float


def _with(**changes: Any) -> dict[str, Any]:
    raw = to_wire(tele())
    for key, value in changes.items():
        if value is _DROP:
            del raw[key]
        else:
            raw[key] = value
    return raw


_DROP = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"source": _DROP}, "required field 'source' is missing"),
        ({"source": ""}, "field 'source' is empty"),
        ({"source": 3}, "field 'source' must be a string, got int"),
        ({"source": "s" * (MAX_SOURCE_CHARS + 1)}, "field 'source' is 65 chars, max 64"),
        ({"device": _DROP}, "required field 'device' is missing"),
        ({"device": None}, "field 'device' must be a string, got NoneType"),
        ({"device": "d" * 65}, "field 'device' is 65 chars, max 64"),
        ({"host": _DROP}, "required field 'host' is missing"),
        ({"pid": -1}, "field 'pid' is -1, must be >= 0"),
        ({"values": _DROP}, "required field 'values' is missing"),
        ({"values": [1.0]}, "field 'values' must be a map of name -> number"),
        ({"values": {"npu/temp_c": "hot"}}, "value 'npu/temp_c' must be a number, got str"),
        ({"values": {"": 1.0}}, "value name '' is not a valid name"),
        ({"values": {"npu/temp_c": True}}, "value 'npu/temp_c' must be a number, got bool"),
        (
            {"values": {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}},
            f"{MAX_METRICS + 1} values in one record, max {MAX_METRICS}",
        ),
        ({"labels": _DROP}, "required field 'labels' is missing"),
        ({"labels": "OK"}, "field 'labels' must be a map of name -> string"),
        ({"labels": {"npu/health": 1}}, "label 'npu/health' must be a string, got int"),
        ({"labels": {"": "x"}}, "label name '' is not a valid name"),
        (
            {"labels": {"gpu/throttle": "x" * (MAX_LABEL_CHARS + 1)}},
            f"label 'gpu/throttle' is {MAX_LABEL_CHARS + 1} chars, max {MAX_LABEL_CHARS}",
        ),
        (
            {"labels": {f"l{i}": "x" for i in range(MAX_LABELS + 1)}},
            f"{MAX_LABELS + 1} labels in one record, max {MAX_LABELS}",
        ),
        ({"seq": 0}, "field 'seq' is 0, must be >= 1"),
        ({"kind": "telemetri"}, "field 'kind' is 'telemetri', expected one of"),
    ],
)
def test_a_bad_field_is_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_record(_with(**changes))
    assert info.value.reason == "field"
    assert str(info.value).startswith(message), str(info.value)


def test_a_bad_telemetry_record_costs_only_itself_in_a_frame() -> None:
    good = to_wire(tele(2))
    frame = msgpack.packb({"v": 2, "records": [good, _with(values={"x": "y"})]})
    with pytest.raises(DecodeError, match="value 'x' must be a number"):
        decode_frame(frame)
    assert isinstance(decode_record(good), TelemetryRecord)
