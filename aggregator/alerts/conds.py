"""The alert engine's conditions, kept by key and by group, and what publishing them costs.

A *group* is one (rule, run, metric): the conditions of one rule about one run's ranks (and its
run-level one). ``Conds`` notes which groups changed since they were last published, so a tick
publishes those groups again and nothing else: with 100,000 ranks lost, a tick where one more
rank is lost rebuilds the one grouped alert, not 100,000 alerts.

A grouped alert of more than ``RANGES_FROM`` ranks says how many, which ones as ranges, and
the words of the first few ("12,000 ranks lost (ranks 0-11999): rank 0 (node0) ...").

Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from rankwatch.aggregator.alerts.grouping import RankedGroup
from rankwatch.aggregator.divergence.types import Divergence

GROUP_LISTED = 5  # ranks whose own words a grouped alert's message gives
RANGES_FROM = 1024  # a grouped alert of more ranks than this names them as ranges
RANGES_LISTED = 8  # rank ranges named in such a message (the rest are counted)
HEALTH_WORDS = {"stalled": "stalled", "lost": "lost", "crashed": "crashed"}

Group = tuple[str, str, str | None]  # rule, run, metric


class Cond(NamedTuple):
    """One rule's condition about one rank (or a run: ``rank`` None). A tuple, not a frozen
    dataclass: a cascade's step makes one per rank and metric, and a tuple is made in one
    call (``new_cond``), where a dataclass takes an attribute dict or a call per field."""

    rule: str
    run: str
    rank: int | None
    metric: str | None
    since_step: int | None
    since_time: float
    value: float | None
    message: str
    severity: str

    @property
    def key(self) -> str:
        return cond_key(self.rule, self.run, self.rank, self.metric)


_tuple_new = tuple.__new__


def new_cond(*values: Any) -> Cond:
    """``Cond(*values)``, every field given, in order, without the keyword handling."""
    return _tuple_new(Cond, values)


def divergence_cond(
    rule: str, d: Divergence, since_step: int | None, since_time: float, severity: str
) -> Cond:
    """The condition a divergence makes under ``rule``."""
    return _tuple_new(Cond, (rule, d.run, d.rank, d.metric, since_step, since_time, d.value,
                             d.message, severity))  # fmt: skip


def cond_key(rule: str, run: str, rank: int | None, metric: str | None) -> str:
    return f"{rule}|{run}|{'' if rank is None else rank}|{metric or ''}"


def key_words(rule: str, run: str, metric: str | None) -> tuple[str, str]:
    """What ``cond_key`` puts before and after the rank: a group's keys made by joining."""
    return f"{rule}|{run}|", f"|{metric or ''}"


class Conds:
    """Conditions by key and by group; ``dirty``: the groups changed since ``take_dirty``."""

    def __init__(self) -> None:
        self._all: dict[str, Cond] = {}
        self._groups: dict[Group, dict[str, Cond]] = {}
        self._dirty: dict[Group, None] = {}  # ordered: groups publish in the order they changed
        self._ranked: dict[Group, RankedGroup] = {}  # each group's per-rank conditions

    def get(self, key: str) -> Cond | None:
        return self._all.get(key)

    def __len__(self) -> int:
        return len(self._all)

    def values(self) -> Iterable[Cond]:
        return self._all.values()

    def put(self, cond: Cond, key: str | None = None) -> None:
        key = cond.key if key is None else key
        self._all[key] = cond
        group = (cond.rule, cond.run, cond.metric)
        members = self._groups.get(group)
        if members is None:
            members = self._groups[group] = {}
        members[key] = cond
        self._dirty[group] = None
        if cond.rank is not None:
            ranked = self._ranked.get(group)
            if ranked is None:
                ranked = self._ranked[group] = RankedGroup()
            ranked.put(cond.rank, cond)

    def put_many(self, group: Group, conds: Mapping[str, Cond]) -> None:
        """``put`` of each key's condition, all of ``group`` (keys distinct): the same state
        after, the group's members and parts updated once for them all."""
        if not conds:
            return
        self._all.update(conds)
        members = self._groups.get(group)
        if members is None:
            members = self._groups[group] = {}
        members.update(conds)
        self._dirty[group] = None
        by_rank = {c.rank: c for c in conds.values() if c.rank is not None}
        if by_rank:
            ranked = self._ranked.get(group)
            if ranked is None:
                ranked = self._ranked[group] = RankedGroup()
            ranked.put_many(by_rank)

    def pop(self, key: str) -> Cond | None:
        cond = self._all.pop(key, None)
        if cond is not None:
            group = (cond.rule, cond.run, cond.metric)
            members = self._groups[group]
            del members[key]
            if not members:
                del self._groups[group]
            self._dirty[group] = None
            if cond.rank is not None:
                ranked = self._ranked[group]
                ranked.pop(cond.rank)
                if not len(ranked):
                    del self._ranked[group]
        return cond

    def groups(self, rules: Iterable[str] | None = None, run: str | None = None) -> list[Group]:
        """The groups of ``rules`` (and of ``run``), every group when neither is given."""
        wanted = None if rules is None else set(rules)
        return [g for g in self._groups
                if (wanted is None or g[0] in wanted) and (run is None or g[1] == run)]  # fmt: skip

    def group(self, group: Group) -> Mapping[str, Cond]:
        return self._groups.get(group, {})

    def ranked(self, group: Group) -> RankedGroup | None:
        """The group's per-rank conditions (None: it has none)."""
        return self._ranked.get(group)

    def drop_groups(self, groups: Iterable[Group]) -> None:
        for group in groups:
            for key in list(self.group(group)):
                self.pop(key)

    def take_dirty(self) -> list[Group]:
        dirty, self._dirty = list(self._dirty), {}
        return dirty


def rank_ranges(ranks: Sequence[int], limit: int = RANGES_LISTED) -> str:
    """Sorted ``ranks`` as ranges ("0-11999, 12005"), the first ``limit`` of them."""
    if not len(ranks):
        return ""
    arr = np.asarray(ranks, dtype=np.int64)
    cuts = np.flatnonzero(np.diff(arr) != 1) + 1
    starts = np.concatenate(([0], cuts))[:limit].tolist()
    ends = np.concatenate((cuts - 1, [len(arr) - 1]))[:limit].tolist()
    words = ", ".join(
        f"{lo}-{hi}" if hi > lo else f"{lo}"
        for lo, hi in zip(arr[starts].tolist(), arr[ends].tolist(), strict=True)
    )
    return words + (", ..." if len(cuts) >= limit else "")


def group_words(rule: str, first: Sequence[Cond], ranks: Sequence[int]) -> str:
    """A grouped alert's message: its ``ranks`` (in order) and the conditions of the first."""
    listed = "; ".join(c.message for c in first[:GROUP_LISTED])
    n = len(ranks)
    if n <= RANGES_FROM:
        more = f"; and {n - GROUP_LISTED} more" if n > GROUP_LISTED else ""
        return f"{n} ranks: {listed}{more}"
    what = f" {HEALTH_WORDS[rule]}" if rule in HEALTH_WORDS else ""
    rest = n - GROUP_LISTED
    return f"{n:,} ranks{what} (ranks {rank_ranges(ranks)}): {listed}; and {rest:,} more"
