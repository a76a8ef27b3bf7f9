"""The step record's fields are defined once (``records.STEP_FIELDS``): every encoder and decoder
of the agent must spell the same ones. The fast paths are written out for speed, so these tests
are what keeps them from drifting. (The aggregator's msgspec struct: tests/aggregator/ingest.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import STEP_FIELDS, DecodeError, StepBlock, StepRecord

NAMES = [f.name for f in STEP_FIELDS]
REQUIRED = [f.name for f in STEP_FIELDS if f.required]
OPTIONAL = [f.name for f in STEP_FIELDS if not f.required]


def test_the_dataclasses_hold_the_defined_fields() -> None:
    fields = [f for f in dataclasses.fields(StepRecord) if f.name != "kind"]
    assert [f.name for f in fields] == NAMES
    assert [f.name for f in fields if f.default is dataclasses.MISSING] == REQUIRED
    assert {f.name for f in dataclasses.fields(StepBlock)} == set(NAMES)


def test_to_wire_writes_the_defined_fields() -> None:
    rec = StepRecord("r", 0, 1, 1.0, 1, "h", 1, 1, None, {"loss": 1.0}, 7)
    assert list(records.to_wire(rec)) == ["kind", *NAMES]
    legacy = StepRecord("r", 0, 1, 1.0, 1, "h", 1, 1, None, {"loss": 1.0})
    assert list(records.to_wire(legacy)) == ["kind", *REQUIRED]  # incarnation 0: left out


@pytest.fixture
def monitor(tmp_path: Path) -> Monitor:
    # an address nobody listens on: the sender is stopped below and its queue read directly
    mon = Monitor(run="r", rank=0, world_size=1, addr="127.0.0.1:9", log_dir=tmp_path)
    assert mon._sender is not None and mon._sender.close(1.0)
    mon._queue.clear()  # type: ignore[union-attr]  # the start event
    return mon


def test_the_monitors_json_template_and_the_senders_wire_maps_spell_the_defined_fields(
    monitor: Monitor,
) -> None:
    for step in (1, 2):  # the slow path, then the cached template
        monitor.log(step, loss=1.0)
    sender = monitor._sender
    assert sender is not None
    wire = sender._take()
    monitor.close()
    lines = [json.loads(line) for line in monitor.jsonl_path.read_text().splitlines()]
    step_lines = [line for line in lines if line["kind"] == "step"]
    assert len(step_lines) == 2 and len(wire) == 2
    for line in step_lines:
        assert sorted(line) == sorted(["v", "kind", *NAMES])
    for raw in wire:
        assert sorted(raw) == sorted(["kind", *NAMES])
    # both decode to the same records
    decoded = [records.decode_record(raw) for raw in wire]
    assert decoded == [records.from_json_line(json.dumps(line)) for line in step_lines]
    # every other kind carries the common fields, the incarnation among them
    for line in lines:
        assert {"run", "rank", "seq", "time", "inc"} <= set(line)


def _valid() -> dict[str, Any]:
    return records.to_wire(StepRecord("r", 0, 1, 1.0, 1, "h", 1, 1, None, {"loss": 1.0}, 7))


@pytest.mark.parametrize("name", REQUIRED)
def test_every_decoder_requires_each_required_field(name: str) -> None:
    raw = _valid()
    del raw[name]
    if name == "epoch":  # required on the wire as a key, None allowed: a missing one is None
        assert records.decode_record(raw).epoch is None
        return
    with pytest.raises(DecodeError, match=f"'{name}'"):
        records.decode_record(raw)
    with pytest.raises(DecodeError, match=f"'{name}'"):
        records.decode_frame(records.encode_frame([raw, _valid()]))
    with pytest.raises(DecodeError, match=f"'{name}'"):
        records.decode_frame_blocks(records.encode_frame([raw, {**_valid(), "seq": 2}]))


@pytest.mark.parametrize("name", OPTIONAL)
def test_every_decoder_takes_a_record_without_an_optional_field(name: str) -> None:
    raw = _valid()
    del raw[name]
    default = {f.name: f for f in dataclasses.fields(StepRecord)}[name].default
    assert getattr(records.decode_record(raw), name) == default
    (block,) = records.decode_frame_blocks(records.encode_frame([raw, {**raw, "seq": 2}]))
    assert getattr(block, name) == default


def test_every_decoder_reads_every_defined_field() -> None:
    raw = _valid()
    rec = records.decode_record(raw)
    (block,) = records.decode_frame_blocks(records.encode_frame([raw, {**raw, "seq": 2}]))
    assert block.records()[0] == rec == records.decode_frame(records.encode_frame([raw]))[0]
    assert records.to_wire(rec) == raw
