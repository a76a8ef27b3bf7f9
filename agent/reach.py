"""Telling the rank's log when the aggregator cannot be reached, and when it can again.

ZeroMQ reconnects silently, so an address nobody answers at would otherwise go unnoticed for a
whole run. ``Reachability`` is the pure part (time passed in); ``HandshakeWatch`` reads the
socket monitor's events in the sender thread that owns the socket.
"""

from __future__ import annotations

from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

UNREACHABLE_AFTER_S = 30.0  # seconds without a ZeroMQ handshake before the log says so
MAX_EVENTS = 100  # monitor events read per sender wake


class Reachability:
    """Says once per outage that nothing answers at ``addr``, and once that it answers again."""

    def __init__(self, addr: str, jsonl: Path | None, after_s: float, now: float) -> None:
        self.addr = addr
        self.jsonl = jsonl
        self.after_s = after_s
        self.connected = False
        self.warned = False
        self._since = now  # when the current wait for a handshake began

    def tick(self, now: float) -> str | None:
        if self.connected or self.warned or now - self._since < self.after_s:
            return None
        self.warned = True
        where = f"the JSONL file {self.jsonl} only" if self.jsonl else "memory only (no JSONL)"
        return (
            f"rankwatch: nothing reachable at {self.addr} after {now - self._since:.0f} s "
            f"(no ZeroMQ handshake): records go to {where} until an aggregator answers there"
        )

    def handshake(self, now: float) -> str | None:
        self.connected = True
        if not self.warned:
            return None
        self.warned = False
        return (
            f"rankwatch: connected to the aggregator at {self.addr} after "
            f"{now - self._since:.0f} s; records are sent again"
        )

    def disconnected(self, now: float) -> None:
        if self.connected:
            self.connected = False
            self._since = now


class HandshakeWatch:
    """The socket monitor of one socket, read without blocking."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        self._sock = sock
        self._monitor = sock.get_monitor_socket(events)

    def events(self) -> list[int]:
        out = []
        for _ in range(MAX_EVENTS):
            if not self._monitor.poll(0):
                break
            out.append(int(recv_monitor_message(self._monitor)["event"]))
        return out

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(0)
