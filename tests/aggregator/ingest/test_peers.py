"""The resend routes of ``Peers`` at the sizes of the largest jobs, as pure bookkeeping: every
rank of a 100,000-rank job behind its node's relay stays reachable, and a map past its bound
keeps exactly its newest routes."""

from __future__ import annotations

import pytest
from rankwatch.agent.wire.records import RanksBlock
from rankwatch.aggregator.ingest import peers as peers_mod
from rankwatch.aggregator.ingest.peers import Peers


def block(run: str, ranks: list[int], world: int) -> RanksBlock:
    n = len(ranks)
    return RanksBlock(
        run, world, ranks, [1] * n, [0.0] * n, ["node"] * n, [7] * n, [1] * n, [None] * n,
        {"loss": [1.0] * n}, [0] * n,
    )  # fmt: skip


def relays(peers: Peers, run: str, world: int, per_node: int, steps: int) -> list[bytes]:
    """``world`` ranks of ``run``, each node's relay sending its ranks as one block per step."""
    idents = [f"relay-{k}".encode() for k in range(world // per_node)]
    frames = [block(run, list(range(k * per_node, (k + 1) * per_node)), world) for k in
              range(len(idents))]  # fmt: skip
    for _ in range(steps):
        for ident, frame in zip(idents, frames, strict=True):
            peers.saw(ident, peers.get(ident), [frame])
    return idents


def test_every_rank_of_a_100000_rank_job_behind_node_relays_stays_reachable() -> None:
    counts = {"routes_evicted": 0, "peer_ranks_capped": 0}
    peers = Peers(counts)
    idents = relays(peers, "big", 100_000, 8, steps=3)
    assert counts == {"routes_evicted": 0, "peer_ranks_capped": 0}
    assert len(peers.routes) == 100_000
    for rank in (0, 7, 8, 49_999, 65_536, 99_999):  # past the old bound of 65,536 too
        assert peers.identity_of("big", rank) == idents[rank // 8]
    # each relay keeps its own counters: none retired into a label or ``(others)``
    assert len(peers.senders) == 12_500 and peers.retired == {}
    assert all(len(peers.senders[i].ranks) == 8 for i in idents)


def test_a_route_map_past_its_bound_keeps_exactly_its_newest_routes_under_cyclic_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ranks arriving in a cycle longer than the map: each new one pushes out the oldest, the
    # pattern that made a dict's oldest key slow to find (a scan past deleted ones)
    monkeypatch.setattr(peers_mod, "MAX_ROUTES", 100)
    counts = {"routes_evicted": 0, "peer_ranks_capped": 0}
    peers = Peers(counts)
    relays(peers, "r", 160, 8, steps=3)  # 20 relays, 480 routes asked, 160 distinct
    assert len(peers.routes) == 100
    assert counts["routes_evicted"] == 480 - 100
    assert list(peers.routes) == [("r", rank) for rank in range(60, 160)]  # oldest first
    assert peers.identity_of("r", 59) is None and peers.identity_of("r", 60) == b"relay-7"
    # each relay's own set lost what the map lost, and holds what it still routes
    assert sum(len(s.ranks) for s in peers.senders.values()) == 100
    assert list(peers.senders[b"relay-7"].ranks) == [("r", rank) for rank in range(60, 64)]


def test_a_rank_that_moved_to_another_relay_goes_to_the_end_not_out() -> None:
    counts = {"routes_evicted": 0, "peer_ranks_capped": 0}
    peers = Peers(counts)
    relays(peers, "r", 16, 8, steps=1)
    moved = b"relay-new"
    peers.saw(moved, peers.get(moved), [block("r", [0, 1], 16)])
    assert peers.identity_of("r", 0) == moved
    assert list(peers.routes)[-2:] == [("r", 0), ("r", 1)]
    assert ("r", 0) not in peers.senders[b"relay-0"].ranks
    assert counts == {"routes_evicted": 0, "peer_ranks_capped": 0}


@pytest.mark.parametrize(("world", "per"), [(4096, 2048), (100_000, 50_000)])
def test_a_connection_carrying_thousands_of_ranks_keeps_every_one_routable(
    world: int, per: int
) -> None:
    """The soak's process sockets (and a relay in front of a rack): a rank's second record
    finds its route, nothing is capped, and every rank can be asked for a resend. Under the
    old cap of 1,024 per connection every record pushed out one of its own (the cycle above)."""
    counts = {"routes_evicted": 0, "peer_ranks_capped": 0}
    peers = Peers(counts)
    idents = relays(peers, "big", world, per, steps=3)
    assert counts == {"routes_evicted": 0, "peer_ranks_capped": 0}
    assert len(peers.routes) == world
    assert all(peers.identity_of("big", r) == idents[r // per] for r in range(world))
