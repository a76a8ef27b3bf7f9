"""A heartbeat's ``stack`` on the wire: it round-trips through msgpack, JSONL and the
aggregator's decoders; a bad one costs the stack, never the heartbeat."""

from __future__ import annotations

import msgpack
import pytest
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import SCHEMA_VERSION, Heartbeat
from rankwatch.agent.wire.stacks import Frame, StackSample
from rankwatch.aggregator.ingest import frames

SAMPLE = StackSample(
    "framework", "0123456789abcdef",
    (Frame("mindspore/nn/wrap/grad_reducer.py", 310, "AllReduce"),
     Frame("job/train.py", 98, "step")),
    19, 1.7e9, 41.5, "sampler held off 41 s (the main thread held the interpreter lock)",
)  # fmt: skip
BEAT = Heartbeat("run-1", 2, 12, 1.7e9, 19, 5.0, 0, stack=SAMPLE)


def test_a_stack_round_trips_through_every_decoder() -> None:
    frame = records.encode_frame([BEAT])
    assert records.decode_frame(frame) == [BEAT]
    assert frames.decode_frame_blocks(frame) == [BEAT]  # the fast path hands it on
    assert frames.decode_fast(frame) is None
    assert records.from_json_line(records.to_json_line(BEAT)) == BEAT
    plain = Heartbeat("run-1", 2, 12, 1.7e9, 19, 5.0, 0)
    assert "stack" not in records.to_wire(plain)  # no stack: the heartbeat of before
    assert frames.decode_fast(records.encode_frame([plain])) == [plain]


@pytest.mark.parametrize(
    ("stack", "problem"),
    [
        ("text", "refused: stack sample must be a mapping"),
        ({"where": "user", "time": 1.0}, "refused: stack sample: frames must be a list"),
        ({"where": "x", "time": 1.0, "frames": []}, "refused: stack sample: where 'x'"),
        ({"where": "user", "time": 1.0, "frames": [["a.py", True, "f"]]}, "refused: stack"),
        ({"where": "user", "time": 1.0, "frames": [["a.py", 1, "f"]] * 17}, "truncated: 17"),
        ({"where": "user", "time": 1.0, "frames": [["a" * 97, 1, "f"]]}, "truncated: names"),
    ],
)
def test_a_bad_stack_costs_the_stack_not_the_heartbeat(stack: object, problem: str) -> None:
    wire = {**records.to_wire(Heartbeat("r", 0, 3, 1.0, 2, 5.0, 0)), "stack": stack}
    frame = msgpack.packb({"v": SCHEMA_VERSION, "records": [wire]})
    (beat,) = frames.decode_frame_blocks(frame)
    assert isinstance(beat, Heartbeat) and beat.seq == 3 and beat.last_step == 2
    assert beat.stack_problem.startswith(problem)
    assert (beat.stack is None) == problem.startswith("refused")
    assert "stack_problem" not in records.to_wire(beat)
