"""Which records were seen: per (run, rank, incarnation), the sequence numbers as sorted,
merged inclusive intervals, so memory grows with the number of gaps, not with the number of
records. Each incarnation of a rank (a process without its predecessor's JSONL) counts seqs from 1.

Pure: the service asks it whether a record is new (dedupe) and which seqs are missing (resend).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

MAX_INTERVALS = 100_000  # seq intervals per (run, rank); beyond this the oldest gap is given up

__all__ = ["SeqTracker"]


class _Intervals:
    """Sorted, disjoint, non-adjacent inclusive intervals [lo, hi] of seen seqs."""

    __slots__ = ("his", "los")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []

    def add(self, lo: int, hi: int) -> int:
        """Mark [lo, hi] as seen; returns how many seqs in it were new."""
        los, his = self.los, self.his
        # Fast path: seqs almost always arrive in order, extending the last interval.
        if his and lo == his[-1] + 1:
            his[-1] = hi
            return hi - lo + 1
        if not his or lo > his[-1] + 1:
            los.append(lo)
            his.append(hi)
            return hi - lo + 1
        # General case: find every interval that overlaps or touches [lo, hi] and fuse them.
        first = bisect_right(his, lo - 2)  # first interval whose hi >= lo - 1
        last = bisect_right(los, hi + 1)  # intervals before this index start <= hi + 1
        if first == last:  # touches nothing: insert
            los.insert(first, lo)
            his.insert(first, hi)
            return hi - lo + 1
        overlap = sum(max(0, min(his[i], hi) - max(los[i], lo) + 1) for i in range(first, last))
        new_lo, new_hi = min(lo, los[first]), max(hi, his[last - 1])
        los[first:last] = [new_lo]
        his[first:last] = [new_hi]
        return (hi - lo + 1) - overlap

    def contains(self, seq: int) -> bool:
        i = bisect_right(self.los, seq) - 1
        return i >= 0 and self.his[i] >= seq

    def give_up_oldest_gap(self) -> None:
        """Fuse the two oldest intervals: the seqs between them will read as duplicates."""
        if len(self.los) >= 2:
            del self.los[1]
            del self.his[0]


class SeqTracker:
    """Seen sequence numbers per (run, rank, inc), to drop duplicates and find gaps. ``inc``
    (the agent's incarnation, ``records.py``) is 0 for agents that send none."""

    def __init__(self, max_intervals: int = MAX_INTERVALS) -> None:
        if max_intervals < 2:
            raise ValueError(f"max_intervals must be >= 2, got {max_intervals}")
        self._seen: dict[tuple[str, int, int], _Intervals] = {}
        self._incs: dict[tuple[str, int], list[int]] = {}  # (run, rank) -> its incarnations
        self._loaded: set[tuple[str, int, int]] = set()  # (run, rank, inc) the store held
        self._max_intervals = max_intervals
        # run -> (rank, inc) whose seqs have a gap now: the resend sweep and a big run's
        # summary visit these, not every rank.
        self._gapped: dict[str, set[tuple[int, int]]] = {}
        # (run, rank, inc) -> its first missing seq, while it has a gap; and the sequences
        # whose first missing seq changed (a gap opened, moved or closed) since ``take_moved``:
        # what the resender looks at, so its work follows the gaps that change, not the gaps
        self._first: dict[tuple[str, int, int], int] = {}
        self._moved: set[tuple[str, int, int]] = set()
        self.gap_version = 0  # counts the changes of which sequences have a gap (``gapped``)
        self.given_up = 0  # gaps fused away because a rank had more than max_intervals

    def accept(self, run: str, rank: int, seq: int, inc: int = 0) -> bool:
        """Record ``seq``; False when it was already seen (a duplicate)."""
        key = (run, rank, inc)
        iv = self._seen.get(key)
        if iv is None:
            iv = self._seen[key] = _Intervals()
            self._incs.setdefault((run, rank), []).append(inc)
        elif iv.his and seq <= iv.his[-1] and iv.contains(seq):
            return False
        before = len(iv.los)
        iv.add(seq, seq)
        if len(iv.los) > self._max_intervals:
            iv.give_up_oldest_gap()
            self.given_up += 1
        if len(iv.los) != before or before > 1 or iv.los[0] > 1:
            self._note_gaps(key, iv)
        return True

    def accept_many(self, run: str, rank: int, seqs: list[int], inc: int = 0) -> list[bool] | None:
        """``accept`` for each of ``seqs``; None means all were new. The usual batch (seqs
        consecutive, above every seq seen) costs one interval update, not one per seq."""
        iv = self._seen.get((run, rank, inc))
        lo = seqs[0] if seqs else 0
        hi = lo + len(seqs) - 1
        if (
            iv is not None
            and seqs
            and (not iv.his or lo > iv.his[-1])
            and seqs[-1] == hi
            and seqs == list(range(lo, hi + 1))
        ):
            before = len(iv.los)
            iv.add(lo, hi)
            if len(iv.los) > self._max_intervals:
                iv.give_up_oldest_gap()
                self.given_up += 1
            if len(iv.los) != before or before > 1 or iv.los[0] > 1:
                self._note_gaps((run, rank, inc), iv)
            return None
        fresh = [self.accept(run, rank, seq, inc) for seq in seqs]
        return None if all(fresh) else fresh

    def accept_ranks(
        self, run: str, ranks: list[int], seqs: list[int], incs: list[int]
    ) -> list[bool] | None:
        """``accept`` for each (rank, seq, inc) in turn; None means all were new. A rank's
        next seq (the usual record) costs one interval update inline, not a call."""
        seen = self._seen
        fresh: list[bool] | None = None
        for i, (rank, seq, inc) in enumerate(zip(ranks, seqs, incs, strict=True)):
            iv = seen.get((run, rank, inc))
            # the fast path of ``accept``: a rank with no gap, extended by its next seq
            if iv is not None and len(iv.his) == 1 and seq == iv.his[0] + 1 and iv.los[0] == 1:
                iv.his[0] = seq
                continue
            ok = self.accept(run, rank, seq, inc)
            if not ok and fresh is None:
                fresh = [True] * len(seqs)
            if fresh is not None:
                fresh[i] = ok
        return fresh

    def load(self, run: str, rank: int, lo: int, hi: int, inc: int = 0) -> None:
        """Mark the inclusive range [lo, hi] as seen (rebuilding from the store after a restart)."""
        if lo > hi:
            raise ValueError(f"seq range [{lo}, {hi}] for {run!r} rank {rank} is empty")
        key = (run, rank, inc)
        if key not in self._seen:
            self._incs.setdefault((run, rank), []).append(inc)
            self._loaded.add(key)
        iv = self._seen.setdefault(key, _Intervals())
        iv.add(lo, hi)
        while len(iv.los) > self._max_intervals:
            iv.give_up_oldest_gap()
            self.given_up += 1
        self._note_gaps(key, iv)

    def _note_gaps(self, key: tuple[str, int, int], iv: _Intervals) -> None:
        run, rank, inc = key
        first = self._first
        if len(iv.los) > 1 or iv.los[0] > 1:
            missing = 1 if iv.los[0] > 1 else iv.his[0] + 1
            was = first.get(key)
            if was != missing:
                first[key] = missing
                self._moved.add(key)
                if was is None:
                    self._gapped.setdefault(run, set()).add((rank, inc))
                    self.gap_version += 1
        elif first.pop(key, None) is not None:
            self._moved.add(key)
            self.gap_version += 1
            if (gapped := self._gapped.get(run)) is not None:
                gapped.discard((rank, inc))

    def first_gap(self, run: str, rank: int, inc: int = 0) -> int | None:
        """The first missing seq of ``(run, rank, inc)``, None when it has no gap."""
        return self._first.get((run, rank, inc))

    def take_moved(self) -> set[tuple[str, int, int]]:
        """(run, rank, inc) whose first missing seq changed since the last call: a gap that
        opened, a first gap filled (the next one is first now, or none is left)."""
        moved, self._moved = self._moved, set()
        return moved

    def gapped(self, run: str | None = None) -> list[tuple[str, int, int]]:
        """(run, rank, inc) of every sequence (of ``run``'s) with a gap now, in no order."""
        runs = self._gapped.items() if run is None else [(run, self._gapped.get(run, set()))]
        return [(name, rank, inc) for name, keys in runs for rank, inc in keys]

    def gaps(
        self, run: str, rank: int, limit: int | None = None, inc: int = 0
    ) -> list[tuple[int, int]]:
        """Missing inclusive seq ranges below the highest seen (seqs start at 1), oldest first;
        at most ``limit`` of them. A rank may have up to ``max_intervals`` gaps and the service
        asks on every tick, so callers that need only the first few say so."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        iv = self._seen.get((run, rank, inc))
        if iv is None or not iv.los or limit == 0:
            return []
        los, his = iv.los, iv.his
        out = [(1, los[0] - 1)] if los[0] > 1 else []
        end = len(los) - 1 if limit is None else min(len(los) - 1, limit - len(out))
        out.extend((his[i] + 1, los[i + 1] - 1) for i in range(end))
        return out

    def gap_count(self, run: str, rank: int, inc: int = 0) -> int:
        """How many ranges ``gaps()`` would return, without building them."""
        iv = self._seen.get((run, rank, inc))
        if iv is None or not iv.los:
            return 0
        return len(iv.los) - 1 + (iv.los[0] > 1)

    def max_seq(self, run: str, rank: int, inc: int = 0) -> int:
        """Highest seq seen, 0 when none."""
        iv = self._seen.get((run, rank, inc))
        return iv.his[-1] if iv is not None and iv.his else 0

    def intervals(self, run: str, rank: int, inc: int = 0) -> list[tuple[int, int]]:
        """The seen seqs as inclusive ranges, for persisting or debugging."""
        iv = self._seen.get((run, rank, inc))
        return list(zip(iv.los, iv.his, strict=True)) if iv is not None else []

    def stored_before(self, run: str, rank: int, inc: int) -> list[int]:
        """The other incarnations of ``(run, rank)`` when ``inc`` is new since the store was
        loaded; [] when ``inc`` itself came from the store (it is no restart then)."""
        if (run, rank, inc) in self._loaded:
            return []
        return [i for i in self._incs.get((run, rank), ()) if i != inc]

    def keys(self) -> Iterator[tuple[str, int, int]]:
        """(run, rank, inc) of every sequence seen."""
        return iter(list(self._seen))

    def forget(self, run: str) -> None:
        self.gap_version += 1
        self._gapped.pop(run, None)
        self._moved = {key for key in self._moved if key[0] != run}
        for key in [k for k in self._seen if k[0] == run]:
            del self._seen[key]
            self._first.pop(key, None)
            self._loaded.discard(key)
            self._incs.pop(key[:2], None)
