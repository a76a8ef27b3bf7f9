"""The wire form of a stack sample: what the agent sends about where a stalled rank is, and what
the aggregator accepts. Limits are checked on both sides; ``from_dict`` is for input from the
network or an imported file, so it bounds and cleans everything it keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

WHERES = ("framework", "dataloader", "sleep", "user", "unknown")
MAX_FRAMES = 16  # innermost frames kept in a sample
FILE_MAX = 96  # characters of a frame's file name (the tail is kept)
FUNC_MAX = 64  # characters of a function name
SIGNATURE_MAX = 32  # characters of a signature
NOTE_MAX = 200  # characters of a note

__all__ = ["FILE_MAX", "FUNC_MAX", "MAX_FRAMES", "WHERES", "Frame", "StackSample", "truncation"]


@dataclass(frozen=True)
class Frame:
    file: str  # shortened: "mindspore/nn/wrap/grad_reducer.py", "job/train.py"
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass(frozen=True)
class StackSample:
    where: str  # one of WHERES
    signature: str  # stable hash of the frames' (file, function) pairs, lines left out
    frames: tuple[Frame, ...]  # innermost first, at most MAX_FRAMES
    step: int | None = None
    time: float = 0.0
    stalled_s: float = 0.0
    note: str = ""  # e.g. "sampler held off 41 s (the main thread held the interpreter lock)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "where": self.where, "signature": self.signature, "step": self.step,
            "time": self.time, "stalled_s": self.stalled_s, "note": self.note,
            "frames": [[f.file, f.line, f.function] for f in self.frames],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StackSample:
        """From the wire form; ValueError says what is wrong."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"stack sample must be a mapping, got {type(raw).__name__}")
        frames_raw = raw.get("frames")
        if not isinstance(frames_raw, (list, tuple)):
            raise ValueError("stack sample: frames must be a list of [file, line, function]")
        frames = []
        for item in frames_raw[:MAX_FRAMES]:
            if not (isinstance(item, (list, tuple)) and len(item) == 3):
                raise ValueError(f"stack sample: bad frame {str(item)[:80]!r}")
            file, line, func = item
            if type(line) is not int:
                raise ValueError(f"stack sample: frame line must be an integer, got {line!r}")
            frames.append(Frame(clip_tail(str(file), FILE_MAX), line, clip(str(func), FUNC_MAX)))
        where = raw.get("where")
        if where not in WHERES:
            raise ValueError(f"stack sample: where {str(where)[:40]!r} is not one of {WHERES}")
        step, time, stalled = raw.get("step"), raw.get("time"), raw.get("stalled_s", 0.0)
        if step is not None and type(step) is not int:
            raise ValueError(f"stack sample: step must be an integer or null, got {step!r}")
        if not (_finite(time) and _finite(stalled)):
            raise ValueError("stack sample: time and stalled_s must be finite numbers")
        return cls(
            where, printable(str(raw.get("signature", ""))[:SIGNATURE_MAX]), tuple(frames), step,
            float(time), float(stalled), printable(str(raw.get("note", ""))[:NOTE_MAX]),
        )  # fmt: skip


def _finite(value: Any) -> TypeGuard[float]:
    """A finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def truncation(raw: Mapping[str, Any]) -> str:
    """What ``StackSample.from_dict`` cut from ``raw`` to fit the limits ("" when nothing): the
    agent sends samples within them, so a cut says the sender is not one."""
    frames = raw.get("frames")
    frames = frames if isinstance(frames, (list, tuple)) else ()
    cut = []
    if len(frames) > MAX_FRAMES:
        cut.append(f"{len(frames)} frames, {MAX_FRAMES} kept")
    kept = [f for f in frames[:MAX_FRAMES] if isinstance(f, (list, tuple)) and len(f) == 3]
    if any(len(str(f[0])) > FILE_MAX or len(str(f[2])) > FUNC_MAX for f in kept):
        cut.append(f"names over {FILE_MAX} / {FUNC_MAX} characters clipped")
    if (
        len(str(raw.get("note", ""))) > NOTE_MAX
        or len(str(raw.get("signature", ""))) > SIGNATURE_MAX
    ):
        cut.append("note or signature clipped")
    return "; ".join(cut)


def printable(text: str) -> str:
    """Control characters (a terminal escape in a file name) become ``?``."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def clip(text: str, limit: int) -> str:
    """At most ``limit`` printable characters, the head kept."""
    text = printable(text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip_tail(text: str, limit: int) -> str:
    """At most ``limit`` printable characters, the tail kept (a file name's end says most)."""
    text = printable(text[-(limit + 1) :])
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]
