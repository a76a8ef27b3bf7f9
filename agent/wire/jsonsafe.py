"""Non-finite floats in strict JSON: the one definition every encoder and decoder uses.

JSON (RFC 8259) has no NaN or Infinity, so everything rankwatch writes as JSON (the JSONL
fallback, the live feed, webhook bodies, the dashboard's responses) carries them as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, and everything that reads JSON turns those strings
back into floats. ``-0.0`` stays a float and ints stay ints of any size (JSON has no limit;
msgpack's 64-bit limit is the schema's business).

Fast paths may test ``math.isfinite`` inline and call ``json_value`` only for the rest;
``tests/test_jsonsafe.py`` checks each of them against this module.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

NONFINITE_TO_JSON = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # key: repr(float)
JSON_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def json_value(value: float) -> float | str:
    """A float as strict JSON allows it (non-finite floats become strings)."""
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def json_number(value: Any) -> float | None:
    """A float from a strict-JSON value: a number or one of the three strings; None otherwise."""
    if isinstance(value, str):
        return JSON_TO_NONFINITE.get(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types, recursively, with every non-finite float as its string.

    Maps get string keys, tuples and sets become lists, dataclasses become maps of their fields,
    enums their value, numpy arrays and scalars (anything with ``tolist``) their Python values.
    Anything else is returned as it is, for the JSON encoder to serialise or refuse.
    """
    if isinstance(value, float):
        return json_value(value)
    if value is None or isinstance(value, (str, int)):
        return value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        if all(type(v) is int for v in value):  # a grouped alert's ranks: every rank, at once
            return list(value)
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if hasattr(value, "tolist"):  # numpy, without importing it
        return json_safe(value.tolist())
    return value
