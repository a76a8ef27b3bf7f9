"""Value conversion and metric-name checks: table-driven, no I/O."""

from __future__ import annotations

import enum
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from rankwatch.agent.values import NotANumber, check_name, plain, to_float
from rankwatch.agent.wire.records import MAX_NAME_CHARS


class Level(enum.IntEnum):
    HIGH = 3


class Weird:
    def __float__(self) -> float:
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, 0.5),
        (-0.0, -0.0),
        (3, 3.0),
        (True, 1.0),
        (False, 0.0),
        (2**53, float(2**53)),
        (Fraction(1, 4), 0.25),
        (Decimal("1.5"), 1.5),
        (Level.HIGH, 3.0),
        (np.float32(0.25), 0.25),
        (np.float64(1e-300), 1e-300),
        (np.int64(7), 7.0),
        (np.bool_(True), 1.0),
        (np.array(2.5), 2.5),
        (np.array([4.0]), 4.0),
        (np.array([[5]], dtype=np.int8), 5.0),
    ],
)
def test_to_float(value: Any, expected: float) -> None:
    result = to_float(value)
    assert type(result) is float
    assert result == expected
    assert math.copysign(1, result) == math.copysign(1, expected)


@pytest.mark.parametrize("value", [math.nan, np.float32("nan"), np.array([np.nan]), Decimal("NaN")])
def test_to_float_nan(value: Any) -> None:
    assert math.isnan(to_float(value))


@pytest.mark.parametrize(
    ("value", "sign"), [(math.inf, 1), (-math.inf, -1), (np.float16("-inf"), -1)]
)
def test_to_float_inf(value: Any, sign: int) -> None:
    assert to_float(value) == sign * math.inf


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0.5", "str '0.5' is not a number"),
        (b"1", "bytes"),
        (None, "None is not a number"),
        ([1.0], "list"),
        ({"a": 1}, "dict"),
        ((1,), "tuple"),
        (object(), "object"),
        (1 + 2j, "complex"),
        (10**400, "too large for a float"),
        (np.array([1.0, 2.0]), "2 elements"),
        (np.array([]), "0 elements"),
        (np.complex64(1j), "complex"),
        (np.datetime64("2026-01-01"), "datetime64"),
        (np.str_("x"), "str_"),
        (Weird(), "boom"),
        ("x" * 10_000, "..."),  # the message is cut short
    ],
)
def test_to_float_refuses(value: Any, reason: str) -> None:
    with pytest.raises(NotANumber, match=reason.replace("(", r"\(").replace(".", r"\.")):
        to_float(value)


def test_refusal_message_is_short() -> None:
    with pytest.raises(NotANumber) as info:
        to_float("x" * 10_000)
    assert len(str(info.value)) < 120


@pytest.mark.torch
@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda t: t.tensor(1.5), 1.5),
        (lambda t: t.tensor([2.0], requires_grad=True) * 2, 4.0),
        (lambda t: t.tensor(3, dtype=t.int32), 3.0),
        (lambda t: t.tensor(True), 1.0),
        (lambda t: t.tensor(float("nan")), math.nan),
        (lambda t: t.tensor([[0.5]], dtype=t.bfloat16), 0.5),
    ],
)
def test_to_float_torch(make: Any, expected: float) -> None:
    torch = pytest.importorskip("torch")
    result = to_float(make(torch))
    assert type(result) is float
    assert result == expected or (math.isnan(expected) and math.isnan(result))


@pytest.mark.torch
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda t: t.tensor([1.0, 2.0]), "2 elements"),
        (lambda t: t.tensor(1j), "complex"),
        (lambda t: t.nn.Linear(1, 1), "Linear"),
    ],
)
def test_to_float_torch_refuses(make: Any, reason: str) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(NotANumber, match=reason):
        to_float(make(torch))


@pytest.mark.mindspore
def test_to_float_mindspore() -> None:
    ms = pytest.importorskip("mindspore")
    assert to_float(ms.Tensor(2.5, ms.float32)) == 2.5
    assert to_float(ms.Tensor([7], ms.int32)) == 7.0
    assert math.isnan(to_float(ms.Tensor(float("nan"), ms.float32)))
    with pytest.raises(NotANumber, match="2 elements"):
        to_float(ms.Tensor([1.0, 2.0], ms.float32))


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("loss", None),
        ("a" * MAX_NAME_CHARS, None),
        ("train/loss ü", None),
        ("", "empty"),
        ("a" * (MAX_NAME_CHARS + 1), f"{MAX_NAME_CHARS + 1} chars"),
        ("\ud800", "not valid UTF-8"),
        (5, "is a int, not a str"),
        (None, "is a NoneType"),
    ],
)
def test_check_name(name: Any, reason: str | None) -> None:
    result = check_name(name)
    if reason is None:
        assert result is None
    else:
        assert result is not None and reason in result


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}),
        (
            {"f": math.nan, "g": math.inf, "h": -math.inf},
            {"f": "NaN", "g": "Infinity", "h": "-Infinity"},
        ),
        ({"n": np.float32(0.5), "i": np.int64(2)}, {"n": 0.5, "i": 2.0}),
        ({"t": (1, [2, None])}, {"t": [1, [2, None]]}),
        ({1: "k"}, {"1": "k"}),
        ({"big": 2**70}, {"big": str(2**70)}),
        ({"o": Fraction(1, 2)}, {"o": 0.5}),
        ({"obj": Level}, {"obj": str(Level)}),
        ({"s": "\ud800"}, {"s": "?"}),
        ({"x": "y" * 10_000}, {"x": "y" * 4096}),
        ({"d": {"e": {"f": {"g": {"h": 1}}}}}, {"d": {"e": {"f": {"g": "{'h': 1}"}}}}),
    ],
)
def test_plain(value: Any, expected: Any) -> None:
    assert plain(value) == expected


def test_plain_cuts_long_containers() -> None:
    assert len(plain(list(range(10_000)))) == 256
    assert len(plain({str(i): i for i in range(10_000)})) == 256
