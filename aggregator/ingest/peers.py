"""Who sends to the receiver: per-identity counts and the (run, rank) -> identity routes that
resend requests take, all bounded, so a peer inventing run names or reconnecting at will costs
counts, not memory: ``MAX_SENDERS`` identities, ``MAX_ROUTES`` routes in all and
``MAX_RANKS_PER_PEER`` per connection (a relay's oldest rank route gives way to its newest),
``MAX_RETIRED`` labels of evicted identities.

Pure bookkeeping: no sockets. The receiver's thread owns it; ``by_label`` may be called from
other threads (it copies each dict in one C-level call before iterating it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from rankwatch.agent.wire.records import RanksBlock

# per-identity counters kept (DEALERs get a new identity on each reconnect): the 12,500 node
# relays of a 100,000-rank job with room; fewer, and each frame of a relay past them makes a
# new counter and retires the oldest, its counts folded into ``(others)``
MAX_SENDERS = 16_384
MAX_RETIRED = 4096  # labels of evicted identities kept apart; the rest share OTHER_SENDERS
OTHER_SENDERS = "(others)"
# (run, rank) -> identity routes for resend requests, in all: two jobs of 100,000 ranks with
# room (a cap below a job's ranks leaves some unroutable at any time, and re-routes each record)
MAX_ROUTES = 262_144
# routes per connection: a quarter of them all, so one connection cannot take every route,
# and one that carries many ranks (a relay in front of a rack, a load generator's process
# socket) keeps each of them routable. Past it, each new rank pushes out the connection's
# oldest: a cycle of more ranks than the cap re-routes every record and leaves the rest
# unroutable at any time (docs/benchmarks.md, "A wide connection's routes").
MAX_RANKS_PER_PEER = MAX_ROUTES // 4


@dataclass(slots=True)
class SenderStats:
    label: str  # "run/rank" once a valid record came from this identity, else identity hex
    run: str | None = None
    rank: int | None = None
    messages: int = 0
    records: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    relayed: bool = False  # one connection carrying several ranks (a `rankwatch relay`)
    # (run, rank) routed through this identity, oldest first (an ordered set). OrderedDict, as
    # are ``Peers.routes`` and ``senders``: it drops its oldest in constant time, where a
    # dict's first key after many deletions is found by a scan past their holes.
    ranks: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)


class Peers:
    """Senders by identity, and the route of each (run, rank) to the identity it came from.
    ``counts`` gets ``routes_evicted`` and ``peer_ranks_capped``."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.senders: OrderedDict[bytes, SenderStats] = OrderedDict()  # oldest first
        # (run, rank) -> latest identity, oldest first
        self.routes: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self.retired: dict[str, SenderStats] = {}  # stats of evicted identities, by label
        self.totals = counts

    def get(self, identity: bytes) -> SenderStats:
        stats = self.senders.get(identity)
        return stats if stats is not None else self._new_sender(identity)

    def saw(self, identity: bytes, stats: SenderStats, batch: list[Any]) -> None:
        """Valid records came from ``identity``: name it, and route their ranks to it."""
        first = batch[0]
        ranks = type(first) is RanksBlock  # a relay's frame of many ranks
        if stats.run is None:
            self._learn(identity, stats, first.run, first.ranks[0] if ranks else first.rank)
        if ranks or stats.relayed or batch[-1].rank != stats.rank:
            # A relay: every rank behind it is reached through this one identity.
            stats.relayed = True
            routes = self.routes
            for rec in batch:
                keys = (
                    zip(repeat(rec.run), rec.ranks)
                    if type(rec) is RanksBlock
                    else [(rec.run, rec.rank)]
                )
                for key in keys:
                    if routes.get(key) != identity:
                        self._route(key, identity, stats)

    def identity_of(self, run: str, rank: int) -> bytes | None:
        return self.routes.get((run, rank))

    def by_label(self) -> dict[str, dict[str, Any]]:
        """Per-sender counts by run/rank label, evicted identities included."""
        by_label: dict[str, dict[str, Any]] = {}
        for stats in [*self.retired.values(), *self.senders.values()]:
            entry = by_label.setdefault(stats.label, {"messages": 0, "records": 0, "bad": {}})
            entry["messages"] += stats.messages
            entry["records"] += stats.records
            for reason, count in dict(stats.bad).items():
                entry["bad"][reason] = entry["bad"].get(reason, 0) + count
        return by_label

    def _new_sender(self, identity: bytes) -> SenderStats:
        if len(self.senders) >= MAX_SENDERS:
            # Reconnecting DEALERs get fresh identities; fold the oldest into per-label totals.
            self._retire(self.senders.popitem(last=False)[1])
        stats = SenderStats(label=identity.hex())
        self.senders[identity] = stats
        return stats

    def _retire(self, stats: SenderStats) -> None:
        # Its routes stay (they are bounded by MAX_ROUTES and the identity may speak again).
        label = stats.label
        if label not in self.retired and len(self.retired) >= MAX_RETIRED:
            label = OTHER_SENDERS  # a peer making up names must not grow this without end
        blank = SenderStats(label, stats.run, stats.rank)
        kept = self.retired.setdefault(label, blank)
        kept.messages += stats.messages
        kept.records += stats.records
        for reason, count in stats.bad.items():
            kept.bad[reason] = kept.bad.get(reason, 0) + count

    def _learn(self, identity: bytes, stats: SenderStats, run: str, rank: int) -> None:
        stats.run, stats.rank = run, rank
        stats.label = f"{run}/{rank}"
        if self.routes.get((run, rank)) != identity:
            self._route((run, rank), identity, stats)

    def _route(self, key: tuple[str, int], identity: bytes, stats: SenderStats) -> None:
        """Route resends for ``key`` to ``identity`` (newest last), within both bounds."""
        routes = self.routes
        owner = routes.pop(key, None)
        if owner is not None:  # the rank moved (reconnect, or now behind a relay)
            moved = self.senders.get(owner)
            if moved is not None:
                moved.ranks.pop(key, None)
        elif len(routes) >= MAX_ROUTES:
            gone, gone_owner = routes.popitem(last=False)
            self.totals["routes_evicted"] += 1
            held = self.senders.get(gone_owner)
            if held is not None:
                held.ranks.pop(gone, None)
        if len(stats.ranks) >= MAX_RANKS_PER_PEER:
            # One connection naming more ranks than a node has: its own oldest route goes,
            # not another peer's, and a long-lived relay still reaches its newest runs.
            gone, _ = stats.ranks.popitem(last=False)
            routes.pop(gone, None)
            self.totals["peer_ranks_capped"] += 1
        routes[key] = identity
        stats.ranks[key] = None
