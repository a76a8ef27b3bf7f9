"""The two encodings of ``GET /api/runs/{run}/series``: JSON (default) and binary (``?format=bin``).

An overlay of every rank is about a million points. As JSON that is some 20 MB of text and
seconds of float formatting (Python's shortest ``repr`` of each float dominates, whatever builds
the text); as binary it is a copy of the numpy columns the store returns. The page asks for
binary; scripts keep the JSON.

Binary layout, little-endian throughout:

    offset 0    4 bytes   magic ``RWS1``
    offset 4    uint32    H, the length of the header in bytes
    offset 8    H bytes   header: UTF-8 JSON, padded with spaces so that 8 + H is a multiple of 8
    8 + H       float64   the columns, back to back, in the order of ``header["columns"]``

The header holds every field of the JSON response except the points: ``series`` becomes
``{"ranks": [r, ...], "counts": [n_r, ...]}`` (the series columns concatenate the ranks' points
in that order) and ``band`` becomes ``{"count": m}``. ``header["columns"]`` lists
``[name, length]`` pairs: ``series.step``, ``series.value``, ``series.min``, ``series.max``
(length sum(counts); no min/max with ``minmax=false``), then ``band.step``, ``band.median``,
``band.p5``, ``band.p95``, ``band.min``, ``band.max`` (length m). Steps are float64 too (exact
up to 2**53, as in a JavaScript number); NaN and ±Inf are IEEE values, not strings.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from rankwatch.agent.wire.jsonsafe import json_value
from rankwatch.aggregator.provider import BAND_KEYS, SeriesColumns

MAGIC = b"RWS1"
MEDIA_TYPE = "application/octet-stream"
ALIGN_BYTES = 8  # a Float64Array must start at a multiple of 8
SERIES_FIELDS = (("step", "step"), ("value", "value"), ("min", "low"), ("max", "high"))


def _fields(minmax: bool) -> tuple[tuple[str, str], ...]:
    return SERIES_FIELDS if minmax else SERIES_FIELDS[:2]


def _json_list(col: np.ndarray) -> list:
    """A column as a JSON-ready list: non-finite floats become "NaN", "Infinity", "-Infinity"
    (``jsonsafe``'s convention), found with numpy rather than by walking the payload."""
    out = col.tolist()
    if col.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(col))
        for i in bad.tolist():
            out[i] = json_value(out[i])
    return out


def series_json(cols: SeriesColumns, minmax: bool = True) -> dict[str, dict[str, list]]:
    """{"<rank>": {"step", "value", "min", "max"}} with strict-JSON values."""
    fields = _fields(minmax)
    lists = {name: _json_list(getattr(cols, attr)) for name, attr in fields}
    return {
        str(rank): {name: lists[name][a:b] for name, _ in fields} for rank, a, b in cols.spans()
    }


def band_json(band: dict[str, np.ndarray]) -> dict[str, list]:
    return {k: _json_list(np.asarray(band[k])) for k in BAND_KEYS}


def encode(
    head: dict[str, Any],
    cols: SeriesColumns,
    band: dict[str, np.ndarray],
    minmax: bool = True,
) -> memoryview:
    """The binary response body (see the module docstring) for the JSON fields ``head``."""
    columns = [(f"series.{name}", getattr(cols, attr)) for name, attr in _fields(minmax)]
    columns += [(f"band.{k}", np.asarray(band[k])) for k in BAND_KEYS]
    header = {
        **head,
        "series": {"ranks": cols.keys.tolist(), "counts": cols.counts.tolist()},
        "band": {"count": len(band["step"])},
        "columns": [[name, len(col)] for name, col in columns],
    }
    text = json.dumps(header, allow_nan=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(len(MAGIC) + 4 + len(text)) % ALIGN_BYTES)
    start = len(MAGIC) + 4 + len(text)
    buf = np.empty(start + 8 * sum(len(col) for _, col in columns), dtype=np.uint8)
    buf[:start] = np.frombuffer(MAGIC + struct.pack("<I", len(text)) + text, dtype=np.uint8)
    floats = buf[start:].view("<f8")
    at = 0
    for _, col in columns:
        floats[at : at + len(col)] = col  # int64 steps convert here, once
        at += len(col)
    return buf.data  # memoryview(buf): numpy 1 stubs do not give ndarray the buffer protocol


def decode(body: bytes) -> dict[str, Any]:
    """The JSON response's shape from a binary body, as numpy arrays (tests, scripts)."""
    if body[:4] != MAGIC:
        raise ValueError(f"not a rankwatch series body (magic {body[:4]!r})")
    (size,) = struct.unpack_from("<I", body, 4)
    start = 8 + size
    header = json.loads(body[8:start])
    out = {k: v for k, v in header.items() if k not in ("series", "band", "columns")}
    data: dict[str, np.ndarray] = {}
    for name, length in header["columns"]:
        data[name] = np.frombuffer(body, dtype="<f8", count=length, offset=start)
        start += 8 * length
    series, at = {}, 0
    for rank, n in zip(header["series"]["ranks"], header["series"]["counts"], strict=True):
        series[str(rank)] = {
            f: data[f"series.{f}"][at : at + n] for f, _ in SERIES_FIELDS if f"series.{f}" in data
        }
        at += n
    out["series"] = series
    out["band"] = {k: data[f"band.{k}"] for k in BAND_KEYS}
    return out
