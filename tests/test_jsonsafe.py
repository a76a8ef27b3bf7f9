"""Every JSON encoder and decoder agrees with ``agent/wire/jsonsafe.py`` on the awkward values.

The fast paths (the Monitor's line template, the live feed's points, the series columns) test
finiteness inline; each is checked here against the one definition.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankwatch.agent import Monitor
from rankwatch.agent.values import plain
from rankwatch.agent.wire.jsonsafe import (
    JSON_TO_NONFINITE,
    NONFINITE_TO_JSON,
    json_number,
    json_safe,
    json_value,
)
from rankwatch.agent.wire.records import (
    EventRecord,
    StepBlock,
    StepRecord,
    from_json_line,
    to_json_line,
)
from rankwatch.aggregator import feed
from rankwatch.aggregator.alerts.sinks.words import alert_dict
from rankwatch.aggregator.ingest import legacy
from rankwatch.dashboard import jsonenc, prom, seriesfmt

FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.5, 1e308, -1e308, 5e-324, 2.0**53 + 2]
HUGE_INTS = [2**63 - 1, -(2**63), 2**70, -(10**30)]
NESTED = [[math.nan, [math.inf, -0.0]], {"a": -math.inf, "b": [1, 2**70]}, (), [[[]]]]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def text(value: Any) -> str:
    """The canonical strict-JSON text of ``value``."""
    return json.dumps(json_safe(value), allow_nan=False, separators=(",", ":"))


def test_the_definition() -> None:
    assert [json_value(x) for x in FLOATS[:3]] == ["NaN", "Infinity", "-Infinity"]
    assert bits(json_value(-0.0)) == bits(-0.0)
    assert {repr(v): k for k, v in JSON_TO_NONFINITE.items()} == NONFINITE_TO_JSON
    for x in FLOATS:
        back = json_number(json.loads(text(x)))
        assert back is not None and bits(back) == bits(x)
    assert text(HUGE_INTS) == "[" + ",".join(map(str, HUGE_INTS)) + "]"
    assert text(NESTED) == (
        '[["NaN",["Infinity",-0.0]],{"a":"-Infinity","b":[1,1180591620717411303424]},[],[[[]]]]'
    )
    assert [json_number(v) for v in (True, None, "nan", "1.5", [1])] == [None] * 5


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass(frozen=True)
class Thing:
    value: float
    parts: tuple[float, ...]
    colour: Colour


RICH = [*FLOATS, *HUGE_INTS, *NESTED, {1: math.nan}, Thing(math.nan, (math.inf, -0.0), Colour.RED)]


@pytest.mark.parametrize("value", RICH, ids=repr)
def test_recursive_encoders_agree(value: Any) -> None:
    want = text(value)
    dumps = lambda v: json.dumps(v, allow_nan=False, separators=(",", ":"))  # noqa: E731
    assert dumps(feed.jsonable(value)) == want
    assert jsonenc.dumps(value) == want
    assert dumps(jsonenc.jsonable(value)) == want
    assert dumps(alert_dict({"x": value})["x"]) == want


@pytest.mark.parametrize("value", [*FLOATS, NESTED[0], {"a": -math.inf, "b": [[-0.0]]}], ids=repr)
def test_agent_info_encoders_agree(value: Any) -> None:
    assert text(plain(value)) == text(value)
    ev = EventRecord("r", 0, 1, 1.0, 1, "h", 1, "note", None, {"v": value})
    line = json.loads(to_json_line(ev))
    assert json.dumps(line["info"]["v"], separators=(",", ":")) == text(value)


def test_plain_keeps_ints_msgpack_safe() -> None:
    # msgpack has 64-bit ints; JSON does not care, so only the agent's info cuts them to text
    assert [plain(v) for v in HUGE_INTS] == [2**63 - 1, -(2**63), str(2**70), str(-(10**30))]


def test_step_encoders_agree(tmp_path: Path) -> None:
    metrics = {f"m{i}": x for i, x in enumerate(FLOATS)}
    want = {k: text(x) for k, x in metrics.items()}
    rec = StepRecord("r", 0, 1, 1.0, 1, "h", 1, 7, None, metrics)
    raw = json.loads(to_json_line(rec), parse_constant=pytest.fail)
    assert {k: text(v) for k, v in raw["metrics"].items()} == want

    with Monitor(run="enc", rank=0, world_size=1, log_dir=tmp_path) as mon:
        mon.log(7, **metrics)
        path = mon.jsonl_path
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    logged = next(x for x in lines if x.get("kind") == "step")["metrics"]
    assert {k: text(logged[k]) for k in metrics} == want  # the Monitor's inline template

    messages, _ = feed.points_messages([rec], max_points=100)
    assert {m["metric"]: text(m["points"][0][2]) for m in messages} == want
    block = StepBlock(
        "r", 0, 1, "h", 1, [1], [1.0], [7], [None], {k: [x] for k, x in metrics.items()}
    )
    messages, _ = feed.points_messages([block], max_points=100)
    assert {m["metric"]: text(m["points"][0][2]) for m in messages} == want
    assert {k: text(feed.num(x)) for k, x in metrics.items()} == want

    column = seriesfmt._json_list(np.array(FLOATS))
    assert [text(x) for x in column] == [text(x) for x in FLOATS]


@pytest.mark.parametrize("string", ["NaN", "Infinity", "-Infinity"])
def test_decoders_agree(string: str) -> None:
    value = JSON_TO_NONFINITE[string]
    line = to_json_line(StepRecord("r", 0, 1, 1.0, 1, "h", 1, 0, None, {"m": value}))
    rec = from_json_line(line)
    assert isinstance(rec, StepRecord)
    got = {
        "records": rec.metrics["m"],
        "importer": legacy._number("m", string),
        "importer, Python's repr as older tools wrote it": legacy._number("m", repr(value)),
        "jsonenc": jsonenc.parse_finite(string),
    }
    for name, back in got.items():
        assert back is not None and bits(back) == bits(value), name


def test_prometheus_reads_strict_json_values() -> None:
    out = prom.render(
        {
            "runs": [
                {"run": "r", "ranks": [{"rank": 0, "values": {"loss": "NaN", "lr": "-Infinity"}}]}
            ]
        },
        {},
        0,
    )
    assert 'metric="loss"} NaN' in out and 'metric="lr"} -Inf' in out


class Level(enum.IntEnum):
    HIGH = 2


def test_a_sequence_of_plain_ints_is_a_list_of_them_and_anything_else_is_made_one_by_one() -> None:
    ranks = tuple(range(100_000))  # a grouped alert's ranks in a cascade
    assert json_safe(ranks) == list(ranks) and type(json_safe(ranks)) is list
    assert json_safe(frozenset({5, 3})) in ([3, 5], [5, 3]) and json_safe(()) == []
    # a bool, an IntEnum or a float among the ints is converted as before, item by item
    mixed = json_safe((1, True, Level.HIGH, math.nan, 2**70))
    assert mixed == [1, True, 2, "NaN", 2**70]
    assert [type(v) for v in mixed[:3]] == [int, bool, int]
    assert json.dumps(json_safe([[1, 2], (3,)]), separators=(",", ":")) == "[[1,2],[3]]"
