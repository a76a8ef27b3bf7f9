"""Shared fixtures: a real ZeroMQ context, a real Receiver on 127.0.0.1, DEALERs to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import zmq
from rankwatch.aggregator.ingest.receiver import Receiver


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    # Sockets must be closed before term(): with warnings as errors, a socket left to the
    # garbage collector raises ResourceWarning in __del__ instead of closing, and term() hangs.
    context.destroy(linger=0)


@pytest.fixture
def receiver(ctx: zmq.Context) -> Iterator[Receiver]:
    rx = Receiver("127.0.0.1", 0, context=ctx)
    yield rx
    rx.close()


@pytest.fixture
def dealer(ctx: zmq.Context, receiver: Receiver) -> Iterator[Callable[[], zmq.Socket]]:
    made: list[zmq.Socket] = []

    def make() -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.connect(f"tcp://127.0.0.1:{receiver.port}")
        made.append(sock)
        return sock

    yield make
    for sock in made:
        sock.close(0)
