"""How far ingest is behind: passes of the ingest loop and what the receiver has read in,
``heard`` out; no sleeping. With real sockets: the receiver's own ``heard_until``."""

from __future__ import annotations

import time

import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.ingest.progress import ReceiveProgress
from rankwatch.aggregator.ingest.receiver import Receiver

from tests.polling import wait_until

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
    p.passed(4.0, WAIT)  # the pass the stop fell in
    p.read(4.0)
    assert p.heard == pytest.approx(0.8)
    loop(p, 4.1, 5.0)
    assert p.heard == pytest.approx(0.8)  # still settling
    loop(p, 5.1, 5.4)
    assert p.heard == pytest.approx(5.3)
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


def test_the_receiver_has_read_up_to_its_oldest_waiting_frame() -> None:
    """600 frames of 2 kB from one peer: one recv() decodes one round of the backlog's round
    robin (256 kB), so the rest waits and heard_until stays before they were sent; once all
    are handed out it is after."""
    ctx = zmq.Context()
    rx = Receiver("127.0.0.1", 0, context=ctx)
    sock = ctx.socket(zmq.DEALER)
    metrics = {f"metric_{i}": 1.0 for i in range(150)}
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(rx.endpoint)
        rx.recv(50)
        before = time.time()
        for seq in range(1, 601):
            rec = StepRecord("r", 0, seq, time.time(), 1, "h", 1, seq, None, metrics)
            sock.send(records.encode_frame([rec]))
        time.sleep(0.3)  # all of them across loopback into the socket
        got = [0]

        def take() -> bool:
            got[0] += len(rx.recv(50))
            return got[0] > 0

        wait_until(take, 10)
        assert got[0] < 600 and rx.heard_until() < before  # the rest waits in the backlog
        wait_until(lambda: take() and got[0] >= 600, 10)
        assert rx.heard_until() > before
    finally:
        sock.close(0)
        rx.close()
        ctx.term()
