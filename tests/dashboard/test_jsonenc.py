"""Strict JSON: NaN and ±Inf become the JSONL strings; the fast path leaves other data as is."""

from __future__ import annotations

import dataclasses
import enum
import json
import math

import pytest
from rankwatch.dashboard.jsonenc import dumps, dumps_fast, jsonable


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass(frozen=True)
class Thing:
    name: str
    value: float


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": 1.5}, '{"a":1.5}'),
        ({"a": math.nan}, '{"a":"NaN"}'),
        ([math.inf, -math.inf, 0.0], '["Infinity","-Infinity",0.0]'),
        ({1: (2, 3)}, '{"1":[2,3]}'),
        (Color.RED, '"red"'),
        (Thing("x", math.nan), '{"name":"x","value":"NaN"}'),
        ({"s": "<img src=x onerror=alert(1)>"}, '{"s":"<img src=x onerror=alert(1)>"}'),
    ],
)
def test_dumps(value: object, expected: str) -> None:
    text = dumps(value)
    assert text == expected
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in output"))


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.5, "b": None},
        {"type": "points", "points": [[0, 3, 1e-05], [1, 3, "NaN"], [2, 3, 2.5e17]]},
        {"a": math.nan, "run": "r"},
        [math.inf, -math.inf, 0.0],
        {1: (2, 3)},
        Color.RED,
        Thing("x", math.nan),
        {"s": "<img src=x onerror=alert(1)>\n\u2028é"},
        {"n": 2**70},
    ],
)
def test_dumps_fast_is_the_same_json(value: object) -> None:
    text = dumps_fast(value)
    no_bare = {"parse_constant": lambda c: pytest.fail(f"bare {c} in output")}
    assert json.loads(text, **no_bare) == json.loads(dumps(value))
    assert "\n" not in text  # one SSE data line


def test_jsonable_nested() -> None:
    out = jsonable({"series": {3: {"value": [1.0, math.nan, math.inf]}}})
    assert out == {"series": {"3": {"value": [1.0, "NaN", "Infinity"]}}}


def test_unserialisable_is_an_error() -> None:
    with pytest.raises(TypeError, match="object is not JSON serialisable"):
        dumps({"x": object()})
