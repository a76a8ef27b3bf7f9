"""The fast path for step records decodes exactly what the field-by-field path decodes.

Pure. ``_step_fast`` must return the same record where the checked path accepts, and None (so
the checked path runs and words the error) wherever the checked path refuses.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rankwatch.agent.wire.records import (
    MAX_METRICS,
    STEP_FIELDS,
    DecodeError,
    StepRecord,
    _decode_checked,
    _step_fast,
    decode_frame,
    decode_record,
    encode_frame,
    to_json_line,
    to_wire,
)

BASE = to_wire(StepRecord("run-1", 2, 10, 1.5e9, 4, "node0", 1234, 99, 3, {"loss": 0.5}))
FIELDS = ("kind", *(spec.name for spec in STEP_FIELDS))
_DROP = object()
ODD = [_DROP, None, True, False, 0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63),
       -(2**63) - 1, 0.0, -0.0, 1.5, math.nan, math.inf, -math.inf, "", "x", "step", "x" * 256,
       "x" * 257, "NaN", "Infinity", [], {}, b"x"]  # fmt: skip
METRIC_MAPS = [
    {}, {"a": 1}, {"a": True}, {"a": None}, {"a": "NaN"}, {"a": "-Infinity"}, {"a": "1.0"},
    {"a": math.nan}, {"": 1.0}, {"m" * 256: 1.0}, {"m" * 257: 1.0}, {1: 1.0}, {"a": 1.0, "b": 2},
    {str(i): 1.0 for i in range(MAX_METRICS)}, {str(i): 1.0 for i in range(MAX_METRICS + 1)},
]  # fmt: skip


def outcome(fn: Any, raw: Any) -> tuple[str, str]:
    try:
        return "ok", to_json_line(fn(raw))
    except DecodeError as exc:
        return exc.reason, str(exc)


def check(raw: Any) -> None:
    expected = outcome(_decode_checked, raw)
    fast = _step_fast(raw, copy=True)
    if fast is None:
        assert outcome(decode_record, raw) == expected
    else:
        assert expected == ("ok", to_json_line(fast))
        assert type(fast.time) is float and all(type(v) is float for v in fast.metrics.values())


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_field_values_take_the_same_decision(field: str, value: Any) -> None:
    raw = dict(BASE)
    if value is _DROP:
        raw.pop(field, None)  # inc is optional
    else:
        raw[field] = value
    check(raw)


@pytest.mark.parametrize("metrics", METRIC_MAPS, ids=lambda m: repr(m)[:40])
def test_odd_metric_maps_take_the_same_decision(metrics: dict[Any, Any]) -> None:
    check({**BASE, "metrics": metrics})


def test_the_common_case_is_fast() -> None:
    assert _step_fast(BASE, copy=True) is not None
    assert _step_fast({**BASE, "epoch": None, "host": "", "future": 1}, copy=True) is not None
    assert _step_fast({**BASE, "time": 5}, copy=True) is None  # an int time: converted, checked


def test_decode_record_does_not_share_the_metrics_map() -> None:
    raw = {**BASE, "metrics": {"loss": 0.5}}
    rec = decode_record(raw)
    raw["metrics"]["loss"] = 9.0
    assert rec.metrics == {"loss": 0.5}


def test_a_frame_mixing_fast_and_checked_records_keeps_its_order() -> None:
    recs = [BASE, {**BASE, "seq": 11, "time": 7}, {**BASE, "seq": 12, "metrics": {"a": 1}}]
    got = decode_frame(encode_frame(recs))
    assert [(r.seq, r.time, dict(r.metrics)) for r in got] == [
        (10, 1.5e9, {"loss": 0.5}),
        (11, 7.0, {"loss": 0.5}),
        (12, 1.5e9, {"a": 1.0}),
    ]
    assert all(type(r.time) is float and type(r.metrics["a" if r.seq == 12 else "loss"]) is float
               for r in got)  # fmt: skip


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "x" * 257]),
)


@settings(max_examples=400, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(FIELDS), scalars, max_size=3),
    metrics=st.dictionaries(st.text(max_size=3), scalars, max_size=3),
)
def test_random_records_take_the_same_decision(
    changes: dict[str, Any], metrics: dict[str, Any]
) -> None:
    check({**BASE, "metrics": metrics, **changes})
