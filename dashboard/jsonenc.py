"""Strict JSON for the dashboard: NaN and ±Inf travel as "NaN", "Infinity" and "-Infinity".

That is the JSONL convention (``agent/wire/jsonsafe.py``), so the page decodes one format
everywhere. Payloads are mostly finite numbers, so the fast path is a plain ``json.dumps``; only
when it refuses a non-finite float is the payload walked and rewritten.

``dumps_fast`` is the same JSON for the live stream, where a tick's points of every rank are
encoded: msgspec writes each number straight into its buffer, not through a Python string per
value as ``json.dumps`` does (the cost of each is in docs/benchmarks.md, "The live stream's
JSON"). msgspec has no strict mode (it writes NaN and ±Inf as ``null``), so a text holding
``null`` is written again by ``dumps``: a message with a None in it pays twice, and the stream's
points never hold one (``feed.points_messages`` writes non-finite values as their strings).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

import msgspec
from fastapi.responses import JSONResponse
from rankwatch.agent.wire.jsonsafe import json_number, json_safe


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


jsonable = json_safe  # ``obj`` as plain JSON types, every non-finite float as its string
parse_finite = json_number  # a float from a JSON number or non-finite string; None otherwise


def dumps(obj: Any) -> str:
    """Compact strict JSON (RFC 8259) text for ``obj``."""
    try:
        return json.dumps(
            obj, allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=_default
        )
    except ValueError:  # a NaN or infinity somewhere: rewrite and retry
        return json.dumps(
            json_safe(obj),
            allow_nan=False,
            ensure_ascii=False,
            separators=(",", ":"),
            default=_default,
        )


_fast = msgspec.json.Encoder(enc_hook=_default)


def dumps_fast(obj: Any) -> str:
    """``dumps(obj)`` (the same values; numbers may be spelled otherwise, ``1e-05`` as
    ``0.00001``), faster: see the module docstring."""
    try:
        text = _fast.encode(obj)
    except (TypeError, ValueError, OverflowError):  # a key or value msgspec refuses
        return dumps(obj)
    return dumps(obj) if b"null" in text else text.decode()


class StrictJSONResponse(JSONResponse):
    """The app's default response class."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")
