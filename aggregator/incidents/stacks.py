"""Where stalled ranks are: their stack samples grouped by signature, the odd ones out named.

The agent sends a compact stack with its heartbeats while a rank is stalled (``agent/stacks.py``
makes it): innermost frames first, a signature of the frames' (file, function) pairs, and
``where`` the main thread is: ``framework`` (a collective, graph execution), ``dataloader``,
``sleep``, ``user`` or ``unknown``. Pure; the input is whatever arrived, so it is checked and
bounded here again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WHERES = ("framework", "dataloader", "sleep", "user", "unknown")
MAX_FRAMES = 16  # frames kept per sample
FILE_MAX = 96  # characters of a frame's file name (the tail is kept)
FUNC_MAX = 64  # characters of a frame's function name
SIGNATURE_MAX = 32
RANKS_LISTED = 8  # ranks named in a group's line before "+N more"

__all__ = ["StackGroup", "StackSample", "group_stacks", "odd_ones_out", "render_stacks"]


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass(frozen=True)
class StackSample:
    run: str
    rank: int
    time: float
    step: int | None
    where: str  # one of WHERES
    signature: str
    frames: tuple[Frame, ...]  # innermost first
    stalled_s: float = 0.0
    note: str = ""  # e.g. "sampler held off 41 s (main thread held the interpreter lock)"

    @classmethod
    def from_dict(cls, run: str, rank: int, raw: Mapping[str, Any]) -> StackSample:
        """From the agent's wire form; ValueError says what is wrong."""
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
            frames.append(Frame(_tail(_printable(str(file)), FILE_MAX), line,
                                _printable(str(func)[:FUNC_MAX])))  # fmt: skip
        where = raw.get("where")
        if where not in WHERES:
            raise ValueError(f"stack sample: where {str(where)[:40]!r} is not one of {WHERES}")
        step, time, stalled = raw.get("step"), raw.get("time"), raw.get("stalled_s", 0.0)
        if step is not None and type(step) is not int:
            raise ValueError(f"stack sample: step must be an integer or null, got {step!r}")
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in (time, stalled)
        ):
            raise ValueError("stack sample: time and stalled_s must be finite numbers")
        return cls(
            run, rank, float(time), step, where,
            _printable(str(raw.get("signature", ""))[:SIGNATURE_MAX]), tuple(frames),
            float(stalled), _printable(str(raw.get("note", ""))[:200]),
        )  # fmt: skip

    @property
    def top(self) -> Frame | None:
        return self.frames[0] if self.frames else None


@dataclass(frozen=True)
class StackGroup:
    signature: str
    where: str
    ranks: tuple[int, ...]
    sample: StackSample  # the lowest rank's, for its frames

    @property
    def label(self) -> str:
        """``in mindspore/.../grad_reducer.py AllReduce`` or ``in train.py:98 on_step``."""
        top = self.sample.top
        if top is None:
            return "with no Python frame"
        frame = self._telling_frame()
        place = _short(frame.file)
        if self.where == "framework":
            return f"in {place} {frame.function}"
        return f"in {place}:{frame.line} {frame.function}"

    def _telling_frame(self) -> Frame:
        # In the framework, the innermost frame is often a thin wrapper (api.py __call__); the
        # first frame naming a collective says more.
        if self.where == "framework":
            for frame in self.sample.frames:
                if _names_collective(frame):
                    return frame
        return self.sample.frames[0]


def group_stacks(samples: Iterable[StackSample]) -> list[StackGroup]:
    """The latest sample of each rank, grouped by signature; the largest group first (then the
    one holding the lowest rank), so the odd ones out come last."""
    latest: dict[int, StackSample] = {}
    for s in samples:
        old = latest.get(s.rank)
        if old is None or s.time >= old.time:
            latest[s.rank] = s
    by_sig: dict[tuple[str, str], list[StackSample]] = {}
    for s in latest.values():
        by_sig.setdefault((s.signature, s.where), []).append(s)
    groups = []
    for (sig, where), members in by_sig.items():
        members.sort(key=lambda s: s.rank)
        groups.append(StackGroup(sig, where, tuple(s.rank for s in members), members[0]))
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0]))
    return groups


def odd_ones_out(groups: list[StackGroup]) -> tuple[int, ...]:
    """Ranks outside the framework while more (or as many) ranks wait inside it; () when the
    stacks do not single anyone out."""
    waiting = sum(len(g.ranks) for g in groups if g.where == "framework")
    ranks = sorted(r for g in groups if g.where != "framework" for r in g.ranks)
    return tuple(ranks) if 0 < len(ranks) <= waiting else ()


def summary_line(groups: list[StackGroup]) -> str:
    """``3 ranks in mindspore/.../grad_reducer.py AllReduce; rank 2 in train.py:98 on_...``."""
    return "; ".join(f"{_ranks_word(g.ranks)} {g.label}" for g in groups)


def render_stacks(run: str, groups: list[StackGroup], frames: int = 8) -> str:
    """The text of ``rankwatch stacks --run R``: a summary line, then each group's frames."""
    if not groups:
        return f"run {run}: no stack samples (no rank has been stalled)\n"
    ranks = sum(len(g.ranks) for g in groups)
    lines = [f"run {run}: {ranks} ranks sampled, {len(groups)} distinct stacks", ""]
    odd = set(odd_ones_out(groups))
    for g in groups:
        mark = "  <- not where the others are" if odd and set(g.ranks) <= odd else ""
        lines.append(f"{_ranks_word(g.ranks)} {g.label} [{g.where}]{mark}")
        s = g.sample
        step = f"step {s.step}, " if s.step is not None else ""
        lines.append(f"  {step}stalled {s.stalled_s:.0f} s, signature {s.signature or '-'}")
        if s.note:
            lines.append(f"  note: {s.note}")
        lines += [f"    {f}" for f in s.frames[:frames]]
        if len(s.frames) > frames:
            more = len(s.frames) - frames
            lines.append(f"    ... {more} more frame{'s' if more != 1 else ''}")
        lines.append("")
    return "\n".join(lines)


def _ranks_word(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= RANKS_LISTED:
        return f"{len(ranks)} ranks ({', '.join(map(str, ranks))})"
    return f"{len(ranks)} ranks"


_COLLECTIVE_NAMES = (
    "allreduce", "all_reduce", "allgather", "all_gather", "broadcast", "reduce_scatter",
    "reducescatter", "barrier", "grad_reducer", "collective",
)  # fmt: skip


def _names_collective(frame: Frame) -> bool:
    text = f"{frame.file} {frame.function}".lower()
    return any(word in text for word in _COLLECTIVE_NAMES)


def _short(file: str) -> str:
    """``mindspore/nn/wrap/grad_reducer.py`` -> ``mindspore/.../grad_reducer.py``."""
    parts = file.split("/")
    return f"{parts[0]}/.../{parts[-1]}" if len(parts) > 2 else file


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)
