"""Frames received but not yet decoded, held per peer within byte budgets and handed out by
deficit round robin (cost = bytes).

ZeroMQ's ROUTER takes one message from each peer in turn, which is fair in messages but not in
work: one peer's 4 MB frame of absurd records costs as much as thousands of an honest rank's
small frames. Here every peer with items waiting gets ``quantum`` bytes of credit per round and
gives the items its credit covers, so a peer sending big frames waits for its credit while the
others' small frames go through every round. An item is a frame, or what is left of one that
is decoded in parts (``put_front``).

Pure: no sockets, no clock. The receiver puts what it reads and decodes what ``take`` returns.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Backlog(Generic[T]):
    """Per-peer FIFO queues of (item, size), at most ``peer_bytes`` per peer and
    ``total_bytes`` in all (``full()`` says when to stop reading), taken round robin."""

    def __init__(self, peer_bytes: int, total_bytes: int, quantum: int) -> None:
        if not 0 < quantum <= peer_bytes <= total_bytes:
            raise ValueError("need 0 < quantum <= peer_bytes <= total_bytes")
        self.peer_bytes = peer_bytes
        self.total_bytes = total_bytes
        self.quantum = quantum
        self.bytes = 0  # held in all
        self._queues: dict[bytes, deque[tuple[T, int]]] = {}  # peer -> items; next peer first
        self._held: dict[bytes, int] = {}  # peer -> bytes held
        self._credit: dict[bytes, int] = {}  # peer -> unused credit (peers with items only)

    def __len__(self) -> int:
        return len(self._queues)

    def held(self, peer: bytes) -> int:
        return self._held.get(peer, 0)

    def heads(self) -> list[T]:
        """The first (oldest) item of each peer's queue."""
        return [queue[0][0] for queue in self._queues.values()]

    def full(self) -> bool:
        return self.bytes >= self.total_bytes

    def put(self, peer: bytes, item: T, size: int) -> bool:
        """Queue ``item`` last for ``peer``; False (nothing kept) when it would take ``peer``
        past its budget. A peer with nothing held always gets one item in, whatever its size."""
        held = self._held.get(peer, 0)
        if held and held + size > self.peer_bytes:
            return False
        self._queue(peer).append((item, size))
        self._held[peer] = held + size
        self.bytes += size
        return True

    def put_front(self, peer: bytes, item: T, size: int) -> None:
        """Queue ``item`` first for ``peer`` (the rest of an item just taken), budget or not."""
        self._queue(peer).appendleft((item, size))
        self._held[peer] = self._held.get(peer, 0) + size
        self.bytes += size

    def _queue(self, peer: bytes) -> deque[tuple[T, int]]:
        queue = self._queues.get(peer)
        if queue is None:
            queue = self._queues[peer] = deque()
            self._credit[peer] = 0
        return queue

    def take(self, budget: int, max_items: int) -> list[tuple[bytes, T]]:
        """(peer, item) pairs of one round of deficit round robin, in serving order, ending
        early once ``budget`` bytes or ``max_items`` items are given (the peers not served
        yet come first next time; one peer's items may go a few past ``max_items``). Empty
        only when no peer's credit covers its next item yet (call again) or nothing is held."""
        out: list[tuple[bytes, T]] = []
        queues, credits, held = self._queues, self._credit, self._held
        spent = 0
        for _ in range(len(queues)):
            if spent >= budget or len(out) >= max_items:
                break
            peer = next(iter(queues))
            queue = queues.pop(peer)
            credit = credits.pop(peer) + self.quantum
            given = 0
            while queue and queue[0][1] <= credit:
                item, size = queue.popleft()
                credit -= size
                given += size
                out.append((peer, item))
            spent += given
            self.bytes -= given
            if queue:
                queues[peer] = queue  # to the end of the round
                credits[peer] = credit
                held[peer] -= given
            else:
                del held[peer]  # a peer with nothing waiting keeps no credit
        return out
