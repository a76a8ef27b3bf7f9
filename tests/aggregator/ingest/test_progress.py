"""How far ingest is behind: passes of the ingest loop in, ``heard`` out; no sleeping."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.ingest.progress import ReceiveProgress

WAIT = 0.1


def loop(
    progress: ReceiveProgress, start: float, end: float, every: float = 0.2, drained: bool = True
) -> None:
    """Passes from ``start`` to ``end`` that each leave nothing unread (or not)."""
    t = start
    while t < end - 1e-9:
        progress.passed(t, t + 0.01, WAIT, drained=drained)
        t += every


def test_heard_follows_passes_that_leave_nothing_unread() -> None:
    p = ReceiveProgress(0.0)
    loop(p, 0.2, 2.0)
    assert p.heard == pytest.approx(1.8) and p.behind(2.0) == pytest.approx(0.2)
    p.passed(2.0, 2.01, WAIT, drained=False)  # a backlog left: not all is in
    p.passed(2.2, 2.21, WAIT, drained=False)
    assert p.heard == pytest.approx(1.8)
    p.passed(2.4, 2.41, WAIT, drained=True)
    assert p.heard == pytest.approx(2.4)


def test_after_the_loop_stood_still_heard_waits_for_the_network_to_deliver() -> None:
    """Stopped from 1.0 to 4.0 inside a pass (SIGSTOP in the socket's poll): the passes right
    after find the socket empty while ZeroMQ is still reading what the kernel held."""
    p = ReceiveProgress(0.0, gap_s=1.0, settle_s=1.0)
    loop(p, 0.2, 1.0)
    p.passed(1.0, 4.0, WAIT, drained=True)  # a gap: nothing from its start on is claimed
    assert p.heard == pytest.approx(0.8)
    loop(p, 4.1, 5.0)
    assert p.heard == pytest.approx(0.8)  # still settling
    loop(p, 5.1, 5.4)
    assert p.heard == pytest.approx(5.3)
    # a pass that took long because it waited for traffic, or a tick that worked 2 s, is no gap
    q = ReceiveProgress(0.0, gap_s=1.0)
    q.passed(0.0, 1.5, 1.5, drained=True)
    q.passed(1.6, 1.61, WAIT, drained=True)
    assert q.heard == pytest.approx(1.6)
    q.passed(3.6, 3.61, WAIT, drained=True, busy_s=1.95)
    assert q.heard == pytest.approx(3.6)


def test_each_episode_is_counted_at_once_and_told_once_when_it_is_over() -> None:
    p = ReceiveProgress(0.0, report_after_s=1.0)
    loop(p, 0.2, 1.0)
    assert p.caught_up(1.0) is None and p.episodes == 0
    loop(p, 1.0, 2.5, drained=False)  # a backlog the passes do not empty
    assert p.caught_up(2.5) is None and p.episodes == 1  # 1.7 s behind: under way
    loop(p, 2.6, 4.3, drained=False)
    assert p.caught_up(4.3) is None and p.episodes == 1
    loop(p, 4.4, 5.0)
    assert p.caught_up(5.0) == pytest.approx(3.5)  # over: the most it fell behind
    assert p.caught_up(5.2) is None and (p.episodes, p.worst_s) == (1, pytest.approx(3.5))
    assert p.caught_up(7.0) is None and p.episodes == 2  # a second one


def test_bad_settings_are_refused_with_their_name() -> None:
    with pytest.raises(ValueError, match="settle_s"):
        ReceiveProgress(0.0, settle_s=float("nan"))
