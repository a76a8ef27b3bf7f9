"""How far ingest is behind: passes of the ingest loop and what the receiver has read in,
``heard`` out; no sleeping."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.ingest.progress import ReceiveProgress

WAIT = 0.1


def loop(progress: ReceiveProgress, start: float, end: float, lag: float = 0.0) -> None:
    """A pass every 0.2 s from ``start`` to ``end``, each having read in up to ``lag`` ago."""
    t = start
    while t < end - 1e-9:
        progress.passed(t + 0.01, WAIT)
        progress.read(t - lag)
        t += 0.2


def test_heard_follows_what_was_read_in() -> None:
    p = ReceiveProgress(0.0)
    loop(p, 0.2, 2.0)
    assert p.heard == pytest.approx(1.8) and p.behind(2.0) == pytest.approx(0.2)
    p.read(1.0)  # heard never goes back
    assert p.heard == pytest.approx(1.8)
    loop(p, 2.0, 4.0, lag=1.5)  # a steady backlog: it trails by its delay
    assert p.heard == pytest.approx(2.3)


def test_after_the_loop_stood_still_an_empty_socket_proves_nothing_for_a_while() -> None:
    """Stopped from 1.0 to 4.0 (SIGSTOP): the passes right after may find the socket empty
    while ZeroMQ is still reading what the kernel held."""
    p = ReceiveProgress(0.0, gap_s=1.0, settle_s=1.0)
    loop(p, 0.2, 1.0)
    p.passed(4.0, WAIT)  # the pass the stop fell in: a gap of 3 s
    p.read(4.0)
    assert p.heard == pytest.approx(0.8)
    loop(p, 4.1, 7.0)
    assert p.heard == pytest.approx(0.8)  # the senders queued 3 s: as long to come in
    loop(p, 7.1, 7.4)
    assert p.heard == pytest.approx(7.3)
    r = ReceiveProgress(0.0, gap_s=1.0, settle_s=1.0)
    r.passed(1.15, WAIT)  # a gap just over gap_s: settle_s
    loop(r, 1.3, 2.5)
    assert r.heard == pytest.approx(2.3)
    # a pass that took long because it waited for traffic, or a tick that worked 2 s, is no gap
    q = ReceiveProgress(0.0, gap_s=1.0)
    q.passed(1.5, 1.5)
    q.read(1.5)
    q.passed(3.6, WAIT, busy_s=1.95)
    q.read(3.6)
    assert q.heard == pytest.approx(3.6)


def test_each_episode_is_counted_at_once_and_told_once_when_it_is_over() -> None:
    p = ReceiveProgress(0.0, report_after_s=1.0)
    loop(p, 0.2, 1.0)
    assert p.caught_up(1.0) is None and p.episodes == 0
    loop(p, 1.0, 2.6, lag=1.5)  # a backlog the passes do not empty
    assert p.caught_up(2.5) is None and p.episodes == 1  # 1.6 s behind: under way
    loop(p, 2.6, 4.4, lag=3.0)
    assert p.caught_up(4.3) is None and p.episodes == 1
    loop(p, 4.4, 5.0)
    assert p.caught_up(5.0) == pytest.approx(3.1)  # over: the most it fell behind
    assert p.caught_up(5.2) is None and (p.episodes, p.worst_s) == (1, pytest.approx(3.1))
    assert p.caught_up(7.0) is None and p.episodes == 2  # a second one


def test_bad_settings_are_refused_with_their_name() -> None:
    with pytest.raises(ValueError, match="settle_s"):
        ReceiveProgress(0.0, settle_s=float("nan"))
