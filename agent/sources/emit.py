"""One sample as a telemetry record's wire map (pure: the monitor writes and queues it).

Keys become ``<source>/<key>``; values go through ``values.to_float`` like ``log()``'s, labels are
cut to ``records.MAX_LABEL_CHARS`` and at most ``records.MAX_LABELS`` are kept. What is refused
is handed to ``warn(key, message)`` (the monitor says each once) and left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ..values import NotANumber, check_name, to_float
from ..wire.jsonsafe import json_value
from ..wire.records import (
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_METRICS,
    MAX_SOURCE_CHARS,
    SCHEMA_VERSION,
)
from .base import Reading

Warn = Callable[[Any, str], None]


def telemetry_wire(
    ident: Mapping[str, Any],
    where: Mapping[str, Any],
    source: str,
    sample: Mapping[str, Any] | Reading,
    at: float,
    seq: Callable[[], int],
    warn: Warn,
) -> dict[str, Any] | None:
    """The record's wire map (``ident``: run, rank and inc when not 0; ``where``: host and pid;
    ``at``: when the sample was taken), or None when nothing in the sample can be sent. ``seq``
    is called only for a record that will be sent (a seq never goes unused)."""
    reading = sample if isinstance(sample, Reading) else Reading(sample)
    values: dict[str, float] = {}
    for key, value in reading.values.items():
        name = f"{source}/{key}"
        reason = check_name(name) if isinstance(key, str) else f"key {key!r} is not a str"
        if reason:
            warn(("name", name), f"rankwatch: telemetry value skipped: {reason}")
            continue
        try:
            values[name] = to_float(value)
        except NotANumber as exc:
            warn(("value", name), f"rankwatch: telemetry value {name!r} skipped: {exc}")
    if len(values) > MAX_METRICS:
        warn(("count", source), f"rankwatch: source {source!r} gave {len(values)} values, "
             f"only the first {MAX_METRICS} are sent")  # fmt: skip
        values = dict(list(values.items())[:MAX_METRICS])
    if not values:
        return None
    labels: dict[str, str] = {}
    for key, text in reading.labels.items():
        name = f"{source}/{key}"
        if not isinstance(key, str) or check_name(name) or len(labels) == MAX_LABELS:
            warn(("label", name), f"rankwatch: telemetry label {name!r} skipped")
            continue
        labels[name] = str(text)[:MAX_LABEL_CHARS]
    device = reading.device if isinstance(reading.device, str) else str(reading.device)
    return {
        "kind": "telemetry", **ident, "seq": seq(), "time": at, **where, "source": source,
        "device": device[:MAX_SOURCE_CHARS], "values": values, "labels": labels,
    }  # fmt: skip


def json_line(wire: Mapping[str, Any]) -> str:
    """The JSONL line of a telemetry wire map (non-finite values as JSON strings)."""
    text = {k: json_value(v) for k, v in wire["values"].items()}
    return json.dumps(
        {"v": SCHEMA_VERSION, **wire, "time": json_value(wire["time"]), "values": text},
        separators=(",", ":"), ensure_ascii=False,
    )  # fmt: skip
