"""Strict JSON for the dashboard: NaN and ±Inf travel as "NaN", "Infinity" and "-Infinity".

That is the JSONL convention of ``agent/records.py``, so the page decodes one format everywhere.
Payloads are mostly finite numbers, so the fast path is a plain ``json.dumps``; only when it
refuses a non-finite float is the payload walked and rewritten.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _default(obj: Any) -> Any:
    """What ``json.dumps`` cannot serialise on its own (dataclasses, enums, numpy, sets)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, without importing numpy
        return obj.tolist()
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON types with every non-finite float replaced by its string."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else NONFINITE[repr(obj)]
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, str) else k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [jsonable(v) for v in obj]
    return jsonable(_default(obj))


def dumps(obj: Any) -> str:
    """Compact strict JSON (RFC 8259) text for ``obj``."""
    try:
        return json.dumps(
            obj, allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=_default
        )
    except ValueError:  # a NaN or infinity somewhere: rewrite and retry
        return json.dumps(jsonable(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class StrictJSONResponse(JSONResponse):
    """The app's default response class."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


def parse_finite(value: Any) -> float | None:
    """A float from a JSON value that may be one of the non-finite strings; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(value)
    return None
