"""The resender: which gaps are asked for, when, and how often; and that a check's work follows
what changed (the gaps that moved, the ranks woken, the requests due), not every gap held.
(That it asks for what a sweep of every gap asked for: tests/bench/test_resend_bench.py, against
the bench's own copy of the sweep.)"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from rankwatch.aggregator.resend import (
    RESEND_CHECK_S,
    RESEND_MAX_TRIES,
    RESEND_RETRY_S,
    UNREACHED_MAX_S,
    Resender,
)
from rankwatch.aggregator.seqs import SeqTracker


@dataclass
class Agents:
    """The receiver's side: which ranks can be reached, and the requests sent."""

    unreachable: set[tuple[str, int]] = field(default_factory=set)
    sent: list[tuple[float, str, int, int, int]] = field(default_factory=list)
    now: float = 0.0

    def request(self, run: str, rank: int, lo: int, inc: int) -> bool:
        if (run, rank) in self.unreachable:
            return False
        self.sent.append((self.now, run, rank, lo, inc))
        return True


class Looks:
    """``current_inc`` that counts the ranks a check looked at."""

    def __init__(self, incs: dict[tuple[str, int], int] | None = None) -> None:
        self.incs = incs or {}
        self.calls = 0

    def __call__(self, run: str, rank: int) -> int:
        self.calls += 1
        return self.incs.get((run, rank), 0)


def health_of(run: str, ranks: range | list[int]) -> dict[str, dict[int, Any]]:
    return {run: dict.fromkeys(ranks)}


def check(
    res: Resender, seqs: SeqTracker, agents: Agents, now: float, health: Any, looks: Any
) -> int:
    agents.now = now
    return res.request(health, now, seqs, looks, agents.request)


def test_a_gap_is_asked_at_once_again_after_the_retry_time_and_then_given_up() -> None:
    seqs, res, agents, looks = SeqTracker(), Resender(), Agents(), Looks()
    health = health_of("r", [0])
    for seq in (1, 2, 5):
        seqs.accept("r", 0, seq)
    t = 0.0
    while t < 10 * RESEND_RETRY_S:
        check(res, seqs, agents, t, health, looks)
        t += RESEND_CHECK_S
    assert [(when, lo) for when, _, _, lo, _ in agents.sent] == [
        (i * RESEND_RETRY_S, 3) for i in range(RESEND_MAX_TRIES)
    ]
    # the first gap filled: the next one (6 was never seen: 7 came) is asked for at once
    for seq in (3, 4, 7):
        seqs.accept("r", 0, seq)
    check(res, seqs, agents, t, health, looks)
    assert agents.sent[-1] == (t, "r", 0, 6, 0)


def test_checks_look_only_at_what_changed() -> None:
    seqs, res, agents, looks = SeqTracker(), Resender(), Agents(), Looks()
    ranks = 10_000
    health = health_of("big", range(ranks))
    for rank in range(ranks):
        seqs.accept("big", rank, 1)
        seqs.accept("big", rank, 3)  # seq 2 lost for good: no agent will send it
    t = 0.0
    while t <= RESEND_MAX_TRIES * RESEND_RETRY_S:
        check(res, seqs, agents, t, health, looks)
        t += RESEND_CHECK_S
    assert len(agents.sent) == RESEND_MAX_TRIES * ranks  # every gap asked for, three times
    looks.calls = 0
    idle = 0
    for _ in range(200):  # 100 s of checks with every gap given up
        t += RESEND_CHECK_S
        idle += check(res, seqs, agents, t, health, looks)
    assert idle == 0 and looks.calls == 0, f"idle checks looked at {looks.calls} ranks"
    # one rank's gap moves: that rank alone is looked at, and asked
    seqs.accept("big", 77, 2)
    seqs.accept("big", 77, 5)
    t += RESEND_CHECK_S
    assert check(res, seqs, agents, t, health, looks) == 1 and looks.calls == 1
    assert agents.sent[-1] == (t, "big", 77, 4, 0)


def test_an_unreachable_rank_is_tried_ever_later_and_at_once_when_woken() -> None:
    seqs, res, agents, looks = SeqTracker(), Resender(), Agents({("r", 0)}), Looks()
    health = health_of("r", [0])
    seqs.accept("r", 0, 4)  # loaded from the store after a restart, say: seqs 1..3 missing
    tries: list[float] = []
    t = 0.0
    while t < 300.0:
        before = looks.calls
        check(res, seqs, agents, t, health, looks)
        if looks.calls > before:
            tries.append(t)
        t += RESEND_CHECK_S
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps[:4] == [0.5, 1.0, 2.0, 4.0] and max(gaps) == UNREACHED_MAX_S, gaps
    assert agents.sent == []
    # it reconnects: its health changes (lost -> alive), it is asked in the next check
    agents.unreachable.clear()
    res.wake([("r", 0)])
    check(res, seqs, agents, t, health, looks)
    assert agents.sent == [(t, "r", 0, 1, 0)]


def test_a_rank_unknown_to_health_is_asked_once_woken() -> None:
    seqs, res, agents, looks = SeqTracker(), Resender(), Agents(), Looks()
    seqs.accept("r", 3, 5)
    check(res, seqs, agents, 0.0, {}, looks)  # not heard from since the restart
    check(res, seqs, agents, 30.0, {}, looks)
    assert agents.sent == []
    res.wake([("r", 3)])  # its first record since: a new rank to health
    check(res, seqs, agents, 31.0, health_of("r", [3]), looks)
    assert agents.sent == [(31.0, "r", 3, 1, 0)]


def test_the_newest_incarnation_is_asked_for_its_own_gap() -> None:
    seqs, res, agents = SeqTracker(), Resender(), Agents()
    looks = Looks({("r", 0): 9})
    seqs.accept("r", 0, 5, inc=4)  # an earlier incarnation's gap: left to `rankwatch import`
    seqs.accept("r", 0, 1, inc=9)
    seqs.accept("r", 0, 3, inc=9)
    check(res, seqs, agents, 0.0, health_of("r", [0]), looks)
    assert agents.sent == [(0.0, "r", 0, 2, 9)]
