"""The backlog's round robin and budgets: pure, table-free, no sockets."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.ingest.backlog import Backlog


def test_small_frames_of_one_peer_go_while_anothers_big_frame_waits_for_its_credit() -> None:
    b: Backlog[str] = Backlog(peer_bytes=10_000, total_bytes=20_000, quantum=100)
    b.put(b"big", "B1", 1000)
    for i in range(3):
        b.put(b"small", f"s{i}", 10)
    assert b.take(budget=10_000, max_items=100) == [(b"small", "s0"), (b"small", "s1"),
                                                   (b"small", "s2")]  # fmt: skip
    calls = 1
    while not (out := b.take(budget=10_000, max_items=100)):
        calls += 1
    calls += 1
    assert out == [(b"big", "B1")] and calls == 10  # credit 100 per round: the tenth round
    assert len(b) == 0 and b.bytes == 0


def test_budgets_refuse_a_peers_frame_past_its_share_and_say_when_all_are_full() -> None:
    b: Backlog[str] = Backlog(peer_bytes=100, total_bytes=150, quantum=10)
    assert b.put(b"a", "first", 500)  # a peer with nothing held always gets one in
    assert not b.put(b"a", "second", 1)
    assert b.full() and b.held(b"a") == 500
    with pytest.raises(ValueError):
        Backlog(peer_bytes=10, total_bytes=5, quantum=1)


def test_a_budget_ends_a_round_early_and_the_next_call_starts_with_the_peers_not_served() -> None:
    b: Backlog[int] = Backlog(peer_bytes=1000, total_bytes=10_000, quantum=100)
    for peer in (b"a", b"b", b"c"):
        b.put(peer, 1, 60)
    assert b.take(budget=100, max_items=100) == [(b"a", 1), (b"b", 1)]
    b.put(b"a", 2, 60)
    assert b.take(budget=1000, max_items=100) == [(b"c", 1), (b"a", 2)]


def test_put_front_goes_before_what_the_peer_has_queued() -> None:
    b: Backlog[str] = Backlog(peer_bytes=1000, total_bytes=1000, quantum=1000)
    b.put(b"a", "later", 10)
    b.put_front(b"a", "rest", 10)
    assert b.take(budget=1000, max_items=10) == [(b"a", "rest"), (b"a", "later")]
