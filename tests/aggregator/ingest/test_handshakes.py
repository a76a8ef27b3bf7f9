"""A TCP connection that never completes its ZeroMQ handshake (a port scan, a half-open
connect) is counted as ``handshake_incomplete``, not as ``refused`` (which reads like an
authentication failure): on the head's receiver and on a node relay, real sockets."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from rankwatch.aggregator.ingest.receiver import Receiver
from rankwatch.relay.forwarder import Relay

from tests.polling import wait_until


def half_open(
    port: int, counters: Callable[[], dict[str, Any]], poll: Callable[[], object]
) -> None:
    before = counters()["connections"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        # reset only once ZeroMQ has accepted it: a reset still in the kernel's accept queue
        # may never reach ZeroMQ at all, and then there is nothing to count
        wait_until(lambda: (poll(), counters()["connections"] > before)[1], what="the accept")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    # SO_LINGER 0: closed with a reset, before a byte of the handshake was sent


def counted(counters: Callable[[], dict[str, Any]], poll: Callable[[], object]) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        poll()
        c = counters()
        return c if c["handshake_incomplete"] >= 2 else None

    return wait_until(done)  # type: ignore[no-any-return]


def test_the_receiver_counts_half_open_connections_apart_from_refusals(
    receiver: Receiver,
) -> None:
    for _ in range(2):
        half_open(receiver.port, receiver.counters, lambda: receiver.recv(20))
    c = counted(receiver.counters, lambda: receiver.recv(20))
    assert c["refused"] == 0 and c["refused_by"] == {}
    assert c["connections"] >= 2


def test_a_relay_counts_half_open_connections_apart_from_refusals() -> None:
    relay = Relay("tcp://127.0.0.1:0", "tcp://127.0.0.1:1", batch_ms=10)
    relay.start()
    try:
        for _ in range(2):
            half_open(relay.port, relay.counters, lambda: None)
        c = counted(relay.counters, lambda: None)
        assert c["refused"] == 0 and c["refused_by"] == {}
    finally:
        relay.stop(timeout_s=0.5)
