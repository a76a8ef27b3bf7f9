"""Which of a hang's ranks got least far (its culprits when no stack sample tells them apart),
and that answer kept between judgements of one incident (``KeptLeast``). Pure.

A hang of 100,000 ranks reports its stalls a hundred ranks per tick; judged again after each,
the kept answer reads the ranks that came and those whose health changed since (``Moves``), not
every candidate's health again.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress, repeat
from operator import attrgetter, eq

from rankwatch.aggregator.health import RankHealth
from rankwatch.aggregator.incidents.scan import positions

__all__ = ["KeptLeast", "Moves", "least_progress", "progress_key"]

Key = tuple[float, float]  # (last step, last progress): the lower, the less far
MOVES_MIN = 4096  # ranks the log holds at least before its oldest half is dropped


def progress_key(rank: int, health: Mapping[int, RankHealth]) -> tuple[float, float, int]:
    """(last step, last progress, rank): a rank not yet at its first step is at step -1, a rank
    not known last of all."""
    h = health.get(rank)
    if h is None:
        return (float("inf"), float("inf"), rank)
    step = h.last_step if h.last_step is not None else -1
    return (float(step), h.last_progress, rank)


def least_progress(candidates: set[int], health: Mapping[int, RankHealth]) -> tuple[int, ...]:
    """The candidates least far (``progress_key``'s least: the lowest last step, then the
    earliest last progress), ascending. A stall of 50,000 ranks is read in C, column by column,
    not with a key made per rank."""
    ranks = list(candidates)
    if candidates <= health.keys():
        hs = list(map(health.__getitem__, ranks))
        steps = list(map(_LAST_STEP, hs))
        if None not in steps:  # else a rank before its first step: one by one
            rows = positions(steps, min(steps))
            progress = list(map(_LAST_PROGRESS, map(hs.__getitem__, rows)))
            least = map(eq, progress, repeat(min(progress)))
            return tuple(sorted(compress(map(ranks.__getitem__, rows), least)))
    ranked = sorted(ranks, key=lambda r: progress_key(r, health))
    best = progress_key(ranked[0], health)[:2]
    return tuple(r for r in ranked if progress_key(r, health)[:2] == best)


_LAST_STEP, _LAST_PROGRESS = attrgetter("last_step"), attrgetter("last_progress")


class Moves:
    """The ranks whose health the tracker replaced, in order: a log each kept answer reads from
    where it last looked. Its oldest half goes once it holds twice the ranks known; an answer
    that last looked before that is made again from every candidate."""

    __slots__ = ("base", "ranks")

    def __init__(self) -> None:
        self.base = 0  # the position of ``ranks[0]`` since the first
        self.ranks: list[int] = []

    @property
    def end(self) -> int:
        return self.base + len(self.ranks)

    def add(self, ranks: list[int], known: int) -> None:
        self.ranks += ranks
        if len(self.ranks) > max(MOVES_MIN, 2 * known):
            drop = len(self.ranks) // 2
            del self.ranks[:drop]
            self.base += drop

    def since(self, at: int) -> list[int] | None:
        """The ranks moved from position ``at`` on; None where the log no longer goes back."""
        return None if at < self.base else self.ranks[at - self.base :]


class KeptLeast:
    """``least_progress`` of one incident's candidates, kept: a judgement looks again only at
    the candidates new since the last one and those whose health moved. Progress may go back
    (a restarted rank), so a moved rank's key is read again whichever way it went; the answer
    is made from every candidate when a least rank moved on and none is left at its key, or a
    least rank is no longer a candidate."""

    __slots__ = ("_at", "_best", "_out", "_ranks", "_seen")

    def __init__(self) -> None:
        self._seen: set[int] | None = None  # the candidates looked at (owned: a copy)
        self._best: Key = (0.0, 0.0)
        self._ranks: set[int] = set()  # the candidates at ``_best``
        self._out: tuple[int, ...] = ()  # ``_ranks`` ascending
        self._at = 0  # the position in the moves log looked at up to

    def __call__(
        self, candidates: set[int], health: Mapping[int, RankHealth], moves: Moves
    ) -> tuple[int, ...]:
        moved = moves.since(self._at) if self._seen is not None else None
        self._at = moves.end
        seen, ranks = self._seen, self._ranks
        if moved is None or seen is None or not ranks:
            return self._made(candidates, health)
        new = candidates - seen
        if len(candidates) - len(new) != len(seen):  # some candidates left
            gone = seen - candidates
            if not gone.isdisjoint(ranks):
                return self._made(candidates, health)
            seen -= gone
        look = new.union(seen.intersection(moved)) if moved else new
        seen |= new
        best, changed = self._best, False
        lower: Key | None = None
        lower_ranks: list[int] = []
        for r in look:
            key = progress_key(r, health)[:2]
            if key == best:
                changed |= r not in ranks
                ranks.add(r)
                continue
            changed |= r in ranks
            ranks.discard(r)
            if key < best and (lower is None or key <= lower):
                if key != lower:
                    lower, lower_ranks = key, []
                lower_ranks.append(r)
        if lower is not None:
            self._best, self._ranks = lower, set(lower_ranks)
        elif not ranks:  # every least rank moved on: who is least now is anyone's guess
            return self._made(candidates, health)
        if changed or lower is not None:
            self._out = tuple(sorted(self._ranks))
        return self._out

    def _made(self, candidates: set[int], health: Mapping[int, RankHealth]) -> tuple[int, ...]:
        out = least_progress(candidates, health)
        self._seen, self._out, self._ranks = set(candidates), out, set(out)
        self._best = progress_key(out[0], health)[:2] if out else (0.0, 0.0)
        return out
