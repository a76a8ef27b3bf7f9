"""Framework values -> float, in one place, never importing a framework to do it.

Accepted: ``float``, ``int``, ``bool`` (``True`` -> 1.0), anything with ``__float__``
(``fractions.Fraction``, ``decimal.Decimal``), NumPy scalars and arrays of exactly one element,
PyTorch tensors of one element (``.detach().item()``: on a GPU this waits for the value),
MindSpore tensors of one element (``.asnumpy()``). NaN and ±Inf pass through.

Everything else is *skipped*, never raised into training: strings (even ``"0.5"``), ``None``,
lists, dicts, bytes, complex numbers, arrays of several elements, integers too large for a
float. ``to_float`` raises ``NotANumber`` with the reason; the monitor catches it, drops that
metric from the record and logs the reason once per metric name.

Metric names must be non-empty ``str`` of at most ``records.MAX_NAME_CHARS`` characters and
valid UTF-8; ``check_name`` says why a name is refused (the monitor skips it the same way).

Event info is free-form; ``plain`` turns it into JSON- and msgpack-safe data: numbers stay
numbers (non-finite ones become ``"NaN"``/``"Infinity"``/``"-Infinity"``), tensors become
floats, anything else its ``str``; strings, containers and nesting are cut to sane sizes.
"""

from __future__ import annotations

import itertools
from typing import Any

from .wire.jsonsafe import json_value
from .wire.records import MAX_NAME_CHARS

MAX_INFO_CHARS = 4096  # strings in event info are cut to this
MAX_INFO_ITEMS = 256  # items per list/map in event info


class NotANumber(TypeError):
    """A metric value that cannot be logged as a float; the message says why."""


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _scalar(item: Any, value: Any) -> float:
    # .item() hands back a Python scalar; complex or datetime ones are not metrics.
    if isinstance(item, (bool, int, float)):
        return float(item)
    raise NotANumber(f"{type(value).__name__} holding {type(item).__name__} is not a real number")


def _one_element(value: Any, size: Any) -> None:
    if size != 1:
        raise NotANumber(f"{type(value).__name__} with {size} elements is not a scalar")


def to_float(value: Any) -> float:
    """``value`` as a float, or ``NotANumber`` saying why it cannot be one."""
    cls = type(value)
    if cls is float:
        return value
    if cls is int or cls is bool:
        try:
            return float(value)
        except OverflowError:
            raise NotANumber(f"integer {_describe(value)} is too large for a float") from None
    module = (getattr(cls, "__module__", "") or "").partition(".")[0]
    try:
        if module == "torch":
            # Checked by module name so torch is never imported for a value that is not its own.
            _one_element(value, value.numel())
            return _scalar(value.detach().item(), value)
        if module == "mindspore":
            array = value.asnumpy()
            _one_element(value, array.size)
            return _scalar(array.item(), value)
        if module == "numpy":
            _one_element(value, getattr(value, "size", 1))
            return _scalar(value.item(), value)
    except NotANumber:
        raise
    except Exception as exc:  # a framework's own error (freed tensor, device error, ...)
        raise NotANumber(f"cannot read {type(value).__name__}: {exc}") from None
    if isinstance(value, (str, bytes, bytearray)):
        raise NotANumber(f"{cls.__name__} {_describe(value)} is not a number")
    if value is None:
        raise NotANumber("None is not a number")
    if isinstance(value, (int, float)):  # subclasses such as IntEnum
        return to_float(int(value) if isinstance(value, int) else float(value))
    if hasattr(cls, "__float__"):
        try:
            return float(value)
        except Exception as exc:
            raise NotANumber(f"{cls.__name__} {_describe(value)}: {exc}") from None
    raise NotANumber(f"{cls.__name__} {_describe(value)} is not a number")


def check_name(name: Any) -> str | None:
    """None for a usable metric name, else the reason it is refused."""
    if not isinstance(name, str):
        return f"metric name {_describe(name)} is a {type(name).__name__}, not a str"
    if not name:
        return "metric name is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"metric name {name[:40]!r}... is {len(name)} chars, max {MAX_NAME_CHARS}"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"metric name {_describe(name)} is not valid UTF-8"
    return None


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON- and msgpack-safe data (event info is free-form)."""
    if value is None or isinstance(value, (bool, int)):
        return value if not isinstance(value, int) or -(2**63) <= value < 2**63 else str(value)
    if isinstance(value, float):
        return json_value(value)
    if isinstance(value, str):
        return value[:MAX_INFO_CHARS].encode("utf-8", "replace").decode("utf-8")
    if depth < 4 and isinstance(value, dict):
        items = itertools.islice(value.items(), MAX_INFO_ITEMS)
        return {plain(str(k)): plain(v, depth + 1) for k, v in items}
    if depth < 4 and isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value[:MAX_INFO_ITEMS]]
    try:
        number = to_float(value)  # a tensor or numpy scalar in eval info
    except NotANumber:
        return plain(str(value), depth)
    return plain(number, depth)
