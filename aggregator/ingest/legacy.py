"""The legacy per-rank callback logs (``<model>_rank<k>.jsonl``: one JSON object per line with
``step``, ``loss``, ``timestamp`` ..., no schema version) read as wire records. Pure but for the
file's name, its neighbours (the world size) and its mtime (a line without a timestamp)."""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rankwatch.agent.wire.jsonsafe import JSON_TO_NONFINITE, NONFINITE_TO_JSON
from rankwatch.agent.wire.records import DecodeError, Record, decode_record

LEGACY_NAME = re.compile(r"^(?P<model>.+)_rank(?P<rank>\d+)\.jsonl$")
_LEGACY_EVENTS = {"train_end": "end", "train_begin": "start", "train_start": "start",
                  "crash": "crash", "error": "crash", "exception": "crash",
                  "eval": "eval"}  # fmt: skip
_LEGACY_FIELDS = {"step", "epoch", "loss", "timestamp", "time", "rank", "event", "world_size",
                  "host", "pid", "run", "seq"}  # fmt: skip
_NONFINITE = JSON_TO_NONFINITE | {k: JSON_TO_NONFINITE[v] for k, v in NONFINITE_TO_JSON.items()}


class LegacyContext:
    """What a legacy line needs from its file name and directory."""

    def __init__(self, path: Path, run: str | None) -> None:
        m = LEGACY_NAME.match(path.name)
        self.model = m["model"] if m else path.stem
        self.run = run or self.model
        self.file_rank = int(m["rank"]) if m else None
        self._path = path
        self._world: int | None = None
        self._mtime: float | None = None
        self._last_time: float | None = None  # the latest timestamp a line of the file gave

    def world_size(self) -> int:
        """The ranks of this model whose files sit next to this one (max rank + 1)."""
        if self._world is None:
            ranks = [self.file_rank or 0]
            for p in self._path.parent.glob(f"{glob_escape(self.model)}_rank*.jsonl"):
                m = LEGACY_NAME.match(p.name)
                if m and m["model"] == self.model:
                    ranks.append(int(m["rank"]))
            self._world = max(ranks) + 1
        return self._world

    def mtime(self) -> float:
        if self._mtime is None:
            self._mtime = self._path.stat().st_mtime
        return self._mtime

    def _time(self, raw: dict[str, Any]) -> Any:
        """The line's timestamp; without one (the callback's last ``train_end`` line has
        none), the file's latest so far: the file's mtime is when it was last copied as often
        as when the training wrote it, and would date the end of a run to the import."""
        given = raw.get("timestamp", raw.get("time"))
        if given is None:
            return self._last_time if self._last_time is not None else self.mtime()
        t = timestamp(given, 0.0)
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            self._last_time = t if self._last_time is None else max(self._last_time, t)
        return t

    def record(self, raw: dict[str, Any], lineno: int) -> Record:
        rank = raw.get("rank", self.file_rank)
        if rank is None:
            raise DecodeError("field", "no 'rank' in the line and none in the file name")
        wire: dict[str, Any] = {
            "run": self.run,
            "rank": rank,
            "seq": lineno,
            "time": self._time(raw),
            "world_size": raw.get("world_size", self.world_size()),
            "host": raw.get("host", ""),
            "pid": raw.get("pid", 0),
        }
        if raw.get("event") is not None:
            event = raw["event"]
            step = raw.get("step")
            info = {k: v for k, v in raw.items() if k not in _LEGACY_FIELDS}
            info["legacy_event"] = event
            if event == "train_end":
                info.setdefault("reason", "normal")
            wire.update(
                kind="event",
                event=_LEGACY_EVENTS.get(str(event), "note"),
                step=None if isinstance(step, int) and step < 0 else step,
                info=info,
            )
            return decode_record(wire)
        wire.update(
            kind="step", step=raw.get("step"), epoch=raw.get("epoch"), metrics=_metrics(raw)
        )
        return decode_record(wire)


def timestamp(value: Any, default: float) -> Any:
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            raise DecodeError("field", f"timestamp {value[:40]!r} is not ISO 8601") from None
    return value  # numbers pass; anything else is reported by decode_record


def _number(name: str, value: Any) -> float:
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    if type(value) not in (int, float):
        raise DecodeError("field", f"'{name}' must be a number, got {type(value).__name__}")
    return _float(name, value)


def _float(name: str, value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # a JSON integer of hundreds of digits
        raise DecodeError("field", f"'{name[:40]}' is an integer too large for a float") from None


def _metrics(raw: dict[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    loss = raw.get("loss")
    if isinstance(loss, dict):
        parts = {str(k): _number(f"loss.{k}", v) for k, v in loss.items()}
        total_key = "total" if "total" in parts else "loss" if "loss" in parts else None
        parts_only = {k: v for k, v in parts.items() if k != total_key}
        metrics["loss"] = parts[total_key] if total_key else math.fsum(parts_only.values())
        metrics.update({f"loss/{k}": v for k, v in parts_only.items()})
    elif loss is not None:
        metrics["loss"] = _number("loss", loss)
    for key, value in raw.items():
        # other numbers (lr, grad_norm, ...) are metrics; labels and flags are not
        if key not in _LEGACY_FIELDS and type(value) in (int, float):
            metrics[key] = _float(key, value)
        elif key not in _LEGACY_FIELDS and isinstance(value, str) and value in _NONFINITE:
            metrics[key] = _NONFINITE[value]
    return metrics


# --- driving a sink -------------------------------------------------------------------------


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)
