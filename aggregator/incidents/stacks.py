"""Where stalled ranks are: their stack samples grouped by signature, the odd ones out named.

The agent sends a compact stack with its heartbeats while a rank is stalled (``agent/stacks.py``
makes it): innermost frames first, a signature of the frames' (file, function) pairs, and
``where`` the main thread is: ``framework`` (a collective, graph execution), ``dataloader``,
``sleep``, ``user`` or ``unknown``. The wire form is defined once, in ``agent/wire/stacks.py``,
which checks and bounds what arrives. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from rankwatch.agent.wire.stacks import MAX_FRAMES, WHERES, Frame
from rankwatch.agent.wire.stacks import StackSample as WireSample
from rankwatch.aggregator.incidents.scan import positions

RANKS_LISTED = 8  # ranks named in a group's line before "+N more"
_PICKED_MAX = 8  # distinct stacks picked out in C; more are grouped sample by sample
_RANK, _SIGNATURE, _WHERE = attrgetter("rank"), attrgetter("signature"), attrgetter("where")

__all__ = [
    "MAX_FRAMES",
    "WHERES",
    "Frame",
    "StackGroup",
    "StackSample",
    "group_stacks",
    "odd_ones_out",
    "render_stacks",
]


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
        """From the agent's wire form (``agent/wire/stacks.py``); ValueError says what is wrong."""
        w = WireSample.from_dict(raw)
        return cls(run, rank, w.time, w.step, w.where, w.signature, w.frames, w.stalled_s, w.note)

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


def group_stacks(
    samples: Iterable[StackSample],
    *,
    one_per_rank: bool = False,
    ranks: Sequence[int] | None = None,
) -> list[StackGroup]:
    """The latest sample of each rank, grouped by signature; the largest group first (then the
    one holding the lowest rank), so the odd ones out come last. ``one_per_rank``: the caller
    knows no rank comes twice. ``ranks``: the samples' ranks in their order, when the caller
    holds them (a dict by rank): no pass over the samples for them."""
    every = list(samples)
    if ranks is not None and len(ranks) != len(every):
        raise ValueError(f"group_stacks: {len(ranks)} ranks for {len(every)} samples")
    if not one_per_rank and len(set(map(_RANK, every))) < len(every):
        latest: dict[int, StackSample] = {}
        for s in every:
            old = latest.get(s.rank)
            if old is None or s.time >= old.time:
                latest[s.rank] = s
        every = list(latest.values())
        ranks = None
    # A stall at 4,096 ranks is a few distinct stacks: each picked out in C, not rank by rank.
    sigs = list(map(_SIGNATURE, every))
    distinct = dict.fromkeys(sigs)
    # (signature, where) -> its samples and, when the caller gave them, their ranks
    by_sig: dict[tuple[str, str], tuple[list[StackSample], list[int] | None]] = {}
    if len(distinct) <= _PICKED_MAX:
        # the odd ones out are few: found by index; the largest group is what is left
        counts = {sig: sigs.count(sig) for sig in distinct}
        largest = max(counts, key=counts.__getitem__, default=None)
        picked = {sig: positions(sigs, sig) for sig in distinct if sig != largest}
        rest = sorted((row for rows in picked.values() for row in rows), reverse=True)
        for sig in distinct:
            if sig == largest:
                same = list(every)
                same_ranks = list(ranks) if ranks is not None else None
                for row in rest:
                    del same[row]
                    if same_ranks is not None:
                        del same_ranks[row]
            else:
                same = list(map(every.__getitem__, picked[sig]))
                same_ranks = None if ranks is None else list(map(ranks.__getitem__, picked[sig]))
            wheres = dict.fromkeys(map(_WHERE, same))
            if len(wheres) == 1:
                by_sig[(sig, same[0].where)] = (same, same_ranks)
            else:
                for where in wheres:
                    by_sig[(sig, where)] = ([s for s in same if s.where == where], None)
    else:
        for s in every:
            by_sig.setdefault((s.signature, s.where), ([], None))[0].append(s)
    groups = []
    for (sig, where), (members, held) in by_sig.items():
        member_ranks = held if held is not None else list(map(_RANK, members))
        if member_ranks != sorted(member_ranks):
            members.sort(key=_RANK)
            member_ranks = sorted(member_ranks)
        groups.append(StackGroup(sig, where, tuple(member_ranks), members[0]))
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
