"""A run's health table: rank -> ``RankHealth`` in rank order, never changed once made.

The health view makes a new table many times a second (every record that may change a state,
every share of the rolling sweep), while other threads read older ones. Copying a run's whole
table for each grew with the ranks already there; a ``RankTable`` is kept in blocks of about
``BLOCK_RANKS`` ranks, and ``replaced`` copies only the blocks its ranks fall in and shares the
others with the table it came from. Its ``tally`` (the counts by state, the odd ranks, the
newest step and record: what a big run's summary needs) is kept up as entries are replaced,
rather than counted again over every rank.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Collection, ItemsView, Iterable, Iterator, Mapping, ValuesView
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

from rankwatch.aggregator.health.rules import RankHealth, RankState

BLOCK_RANKS = 64  # a refresh copies this many entries per rank it changes, about
_SPLIT = 2 * BLOCK_RANKS  # a block that grew past this is cut in blocks of BLOCK_RANKS

_first, _second = itemgetter(0), itemgetter(1)
_ALIVE = RankState.ALIVE
_MISSING: Any = object()
# a state's name: what a Counter hashes in C (an Enum member's hash is a Python call)
_state, _world = attrgetter("state._value_"), attrgetter("world_size")
_seen, _step = attrgetter("last_seen"), attrgetter("last_step")
Maxima = tuple[int, float | None, int | None]  # world size, newest record, furthest step


def odd_by_health(h: RankHealth) -> bool:
    """Whether a summary lists the rank for its health alone: not alive, or dropping records."""
    return h.state is not _ALIVE or bool(h.dropped)


@dataclass(frozen=True)
class Tally:
    """What a summary needs of every rank of a table."""

    counts: dict[RankState, int]  # state -> ranks in it (states with none left out)
    odd: dict[int, RankHealth]  # the ranks ``odd_by_health``, in rank order
    world_size: int  # the largest any rank announced (0: none)
    last_seen: float | None  # the newest record
    last_step: int | None  # the furthest step


def tally_of(entries: Iterable[RankHealth]) -> Tally:
    """One pass over the entries (of a plain mapping; a ``RankTable`` keeps its own)."""
    counts: dict[str, int] = {}  # by the state's name: an Enum member's hash is a Python call
    odd: dict[int, RankHealth] = {}
    world = 0
    seen: float | None = None
    step: int | None = None
    for h in entries:  # one loop: each entry read once (a pass per field costs a pass each)
        state = h.state._value_
        counts[state] = counts.get(state, 0) + 1
        if odd_by_health(h):
            odd[h.rank] = h
        if h.world_size > world:
            world = h.world_size
        if seen is None or h.last_seen > seen:
            seen = h.last_seen
        if h.last_step is not None and (step is None or h.last_step > step):
            step = h.last_step
    return Tally({RankState(s): n for s, n in counts.items()}, odd, world, seen, step)


# What a table keeps of its tally once counted: the counts, the maxima (None: to be counted
# again, the rank holding one moved back), and its odd ranks as a table of their own. One
# tuple, so that a reader never sees half of it.
_Kept = tuple[dict[RankState, int], Maxima | None, "RankTable"]


class RankTable(Mapping[int, RankHealth]):
    """rank -> health in rank order, immutable; ``replaced`` makes the next one."""

    __slots__ = ("_blocks", "_firsts", "_kept", "_len")

    def __init__(self, entries: Iterable[tuple[int, RankHealth]] = ()) -> None:
        pairs = sorted(entries, key=_first)
        starts = range(0, len(pairs), BLOCK_RANKS)
        blocks = [dict(pairs[i : i + BLOCK_RANKS]) for i in starts]
        self._set(blocks, [pairs[i][0] for i in starts], sum(map(len, blocks)))

    def _set(
        self,
        blocks: list[dict[int, RankHealth]],
        firsts: list[int],
        size: int,
        kept: _Kept | None = None,
    ) -> None:
        self._blocks = blocks
        self._firsts = firsts  # each block's lowest rank
        self._len = size
        self._kept = kept  # None: counted at the first ``tally``, then kept up

    @staticmethod
    def of(states: Mapping[int, RankHealth]) -> RankTable:
        return states if isinstance(states, RankTable) else RankTable(states.items())

    # --- Mapping -----------------------------------------------------------------------------

    def __getitem__(self, rank: int) -> RankHealth:
        found = self.get(rank, _MISSING)
        if found is _MISSING:
            raise KeyError(rank)
        return found

    def get(self, rank: int, default: Any = None) -> Any:
        """``Mapping.get`` without its exception for a rank the table lacks (readers look up
        ranks by the thousand)."""
        try:
            i = bisect_right(self._firsts, rank) - 1
        except TypeError:  # not a rank
            return default
        return self._blocks[i].get(rank, default) if i >= 0 else default

    def __contains__(self, rank: object) -> bool:
        return self.get(rank, _MISSING) is not _MISSING  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._blocks)

    def __len__(self) -> int:
        return self._len

    def items(self) -> ItemsView[int, RankHealth]:
        return _Items(self)

    def values(self) -> ValuesView[RankHealth]:
        return _Values(self)

    def __repr__(self) -> str:
        return f"RankTable({dict(self.items())!r})"

    # --- the next table ----------------------------------------------------------------------

    def replaced(
        self, entries: Iterable[tuple[int, RankHealth]], removed: Collection[int] = ()
    ) -> RankTable:
        """This table with ``entries`` (rank, health; each rank once) in place of its own (a
        rank it lacks joins in its place) and without the ranks ``removed``, as a new table
        that shares the blocks none of them fall in. The work per entry is in C (maps,
        ``dict.update``, ``Counter``) but for the odd ranks' rule: a share of the rolling sweep
        is thousands of entries."""
        entries = sorted(entries, key=_first)
        if not self._blocks:
            return RankTable(entries)
        blocks, firsts = list(self._blocks), list(self._firsts)
        ranks = list(map(_first, entries))
        olds: list[RankHealth] = []  # the entries replaced
        size, last, cuts = self._len, len(firsts) - 1, []
        k = 0
        while k < len(ranks):  # block by block: the entries in a block are a slice
            i = max(bisect_right(firsts, ranks[k]) - 1, 0)
            end = bisect_left(ranks, firsts[i + 1], k) if i < last else len(ranks)
            was = blocks[i]
            block = dict(was)
            if end == k + 1:  # one entry in the block: scattered ranks, the usual refresh
                rank, h = entries[k]
                old = was.get(rank)
                block[rank] = h
                before = [old]
                lowest = rank
            else:
                before = list(map(was.get, ranks[k:end]))
                block.update(entries[k:end])
                lowest = ranks[k]
            if len(block) > len(was):  # new ranks, after the others: in place if above them
                size += len(block) - len(was)
                if lowest < next(reversed(was)):
                    block = dict(sorted(block.items(), key=_first))
                olds += [old for old in before if old is not None]
            else:
                olds += before  # type: ignore[arg-type]  # all there: none is None
            blocks[i], firsts[i] = block, next(iter(block))
            if len(block) > _SPLIT:
                cuts.append(i)
            k = end
        for rank in removed:
            i = bisect_right(firsts, rank) - 1
            if i >= 0 and rank in blocks[i]:
                block = blocks[i] = dict(blocks[i])
                del block[rank]
                size -= 1
                if block:
                    firsts[i] = next(iter(block))
                else:
                    cuts.append(i)
        for i in sorted(set(cuts), reverse=True):  # from the end: the indices before stay
            pairs = list(blocks[i].items())
            cut = [dict(pairs[j : j + BLOCK_RANKS]) for j in range(0, len(pairs), BLOCK_RANKS)]
            blocks[i : i + 1] = cut
            firsts[i : i + 1] = [next(iter(b)) for b in cut]
        out = RankTable.__new__(RankTable)
        kept = self._kept
        if kept is not None:
            kept = _kept_up(kept, olds, list(map(_second, entries)))
        out._set(blocks, firsts, size, kept)
        return out

    def tally(self) -> Tally:
        """The table's ``tally_of``, from what it kept (counted once for a new table, again
        for the maxima only after the rank holding one moved back)."""
        kept = self._kept
        if kept is None:
            t = tally_of(self.values())
            maxima = (t.world_size, t.last_seen, t.last_step)
            kept = self._kept = (t.counts, maxima, RankTable(t.odd.items()))  # a reader may
        elif kept[1] is None:  # count too: it finds the same
            t = tally_of(self.values())
            kept = self._kept = (kept[0], (t.world_size, t.last_seen, t.last_step), kept[2])
        counts, found, odd_table = kept
        assert found is not None
        return Tally(dict(counts), dict(odd_table.items()), *found)


def _kept_up(kept: _Kept, olds: list[RankHealth], news: list[RankHealth]) -> _Kept:
    """``kept`` after the entries ``olds`` were replaced and ``news`` put in."""
    counts, maxima, odd = kept
    gone, come = Counter(map(_state, olds)), Counter(map(_state, news))
    if gone != come:
        moved = Counter({state.value: n for state, n in counts.items()})
        moved.subtract(gone)
        moved.update(come)
        counts = {RankState(state): n for state, n in moved.items() if n > 0}
    odd_in = [(h.rank, h) for h in filter(odd_by_health, news)]
    was_odd = {h.rank for h in filter(odd_by_health, olds)}
    if was_odd or odd_in:
        odd = odd.replaced(odd_in, was_odd.difference(rank for rank, _ in odd_in))
    if maxima is not None:
        maxima = _maxima_after(maxima, olds, news)
    return counts, maxima, odd


def _maxima_after(maxima: Maxima, olds: list[RankHealth], news: list[RankHealth]) -> Maxima | None:
    """The maxima after ``olds`` were replaced by ``news``, or None when they may have gone
    down (an entry holding one was replaced by a smaller one): then they are counted again when
    asked for. The largest of the new entries is the table's when it reaches the old maximum;
    otherwise the maximum stands unless an entry replaced held it."""
    if not news:
        return maxima
    world, seen, step = maxima
    top_world = max(map(_world, news))
    if top_world >= world:
        world = top_world
    elif world in map(_world, olds):
        return None
    top_seen = max(map(_seen, news))
    if seen is None or top_seen >= seen:
        seen = top_seen
    elif seen in map(_seen, olds):
        return None
    top_step = max(filter(_is_step, map(_step, news)), default=None)
    if top_step is not None and (step is None or top_step >= step):
        step = top_step
    elif step is not None and step in map(_step, olds):
        return None
    return world, seen, step


def _is_step(step: int | None) -> bool:
    return step is not None


class _Items(ItemsView[int, RankHealth]):
    _mapping: RankTable

    def __iter__(self) -> Iterator[tuple[int, RankHealth]]:
        return chain.from_iterable(b.items() for b in self._mapping._blocks)


class _Values(ValuesView[RankHealth]):
    _mapping: RankTable

    def __iter__(self) -> Iterator[RankHealth]:
        return chain.from_iterable(b.values() for b in self._mapping._blocks)
