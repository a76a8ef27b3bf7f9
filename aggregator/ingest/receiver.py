"""The ZeroMQ ROUTER the agents' DEALER sockets connect to.

Thin on purpose: receive ``[identity, frame]`` messages in batches, decode them with the wire
schema, count what arrives per sender and per problem, and hand the records to the service.
Bad input (not msgpack, wrong schema, extra frames, a newer schema version) is counted and
logged once per sender and reason (``problems.py``); it is never fatal and valid traffic keeps
flowing.

Everything kept per peer is bounded (``peers.py``; the log-once keys in ``problems.py``), so a
peer inventing run names or reconnecting at will costs counts, not memory.

The socket belongs to the thread that calls ``recv()``: ``send_control()`` may be called from
any thread, it only queues, and the queue is flushed by the next ``recv()``.

With ``curve_dir`` the socket is a CurveZMQ server (see ``curve.py``): traffic is encrypted and
only agents holding an allowed client key get in; refused handshakes are counted in
``refused`` (a peer without curve, or with an unknown key). A connection that never finishes
its handshake (a port scan, a half-open connect) is ``handshake_incomplete``, with or without
curve.

One peer cannot hold ingest up: a frame whose records cannot be real (more than its bytes can
hold, or not maps) is refused as a whole from its header (``frames_rejected``, reason
``records``); a frame's bad records cost one count per reason, not one log call each; each
``recv()`` does a bounded amount of work (messages, records seen, bytes) and the ROUTER takes
the peers' messages in turn; ZeroMQ holds at most ``PEER_BUFFER_BYTES`` for one peer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgpack
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.addresses import DEFAULT_INGEST_PORT
from rankwatch.agent.wire.curve import MONITOR_EVENTS, CurveGate, ServerContext, read_monitor
from rankwatch.agent.wire.records import DecodeError, RanksBlock, Record, StepBlock
from rankwatch.aggregator.ingest import frames
from rankwatch.aggregator.ingest.backlog import Backlog
from rankwatch.aggregator.ingest.peers import Peers, SenderStats
from rankwatch.aggregator.ingest.problems import Problems, whose

log = logging.getLogger("rankwatch.receiver")


MAX_BATCH_FRAMES = 2000  # frames decoded per recv() before returning to the service ...
MAX_BATCH_BYTES = 2 * 1024 * 1024  # ... or frame bytes: bounds how long one recv() works
SALVAGE_RECORDS = 2000  # records of a frame with bad ones decoded one by one per turn
MAX_PULL_MESSAGES = 4000  # messages read off the socket into the backlog per recv() ...
MAX_PULL_BYTES = 16 * 1024 * 1024  # ... or bytes
# Frames read but not decoded yet (backlog.py): per peer (then that peer's new frames are
# dropped and counted, and the head asks its agents to re-send the gap), in all (then the
# socket is left unread: ZeroMQ holds the rest, RCVHWM per peer, and the peers queue on their
# side), and the credit per round of the round robin.
BACKLOG_PEER_BYTES = 32 * 1024 * 1024
BACKLOG_TOTAL_BYTES = 256 * 1024 * 1024
BACKLOG_QUANTUM_BYTES = 256 * 1024
# What ZeroMQ holds for one peer while the backlog is full: RCVHWM counts messages, so it is
# set from a byte budget.
PEER_BUFFER_BYTES = 64 * 1024 * 1024
RCVHWM_MESSAGES = PEER_BUFFER_BYTES // records.MAX_FRAME_BYTES
LINGER_MS = 0  # control messages are best effort: never hang on close
Item = Record | StepBlock | RanksBlock


class Receiver:
    """A bound ROUTER socket. ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self,
        host: str = "*",
        port: int = DEFAULT_INGEST_PORT,
        *,
        context: zmq.Context[Any] | None = None,
        endpoint: str | None = None,
        curve_dir: Path | str | None = None,
    ) -> None:
        self._server = ServerContext(context, curve_dir)
        self._ctx = self._server.context
        self.curve: CurveGate | None = self._server.gate
        sock = self._ctx.socket(zmq.ROUTER)
        self._server.configure(sock)
        sock.setsockopt(zmq.MAXMSGSIZE, records.MAX_FRAME_BYTES)
        sock.setsockopt(zmq.RCVHWM, RCVHWM_MESSAGES)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        # Unroutable control messages raise instead of vanishing, so they can be counted.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        endpoint = endpoint or f"tcp://{host}:{port}"
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            endpoint = endpoint[:-1] + "*"  # libzmq's spelling of "any free port"
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            self._server.close()
            raise OSError(f"cannot listen for agents on {endpoint}: {exc}") from None
        self._sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(self.endpoint.rsplit(":", 1)[1]) if self.endpoint.startswith("tcp") else 0
        # Disconnects are how an oversized frame shows up: libzmq drops the peer before
        # the message is complete, so there is no identity and no message to count.
        self._monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        # Each item with the time the socket was last seen empty before it was read: everything
        # that reached the socket before then was read before it (``heard_until``).
        self._backlog: Backlog[tuple[float, bytes | _Rest]] = Backlog(
            BACKLOG_PEER_BYTES, BACKLOG_TOTAL_BYTES, BACKLOG_QUANTUM_BYTES
        )
        self._rests: dict[bytes, _Rest] = {}  # frames decoded in parts: the next part
        self._control: deque[tuple[bytes, bytes]] = deque()
        self._control_lock = threading.Lock()
        self.totals: dict[str, int] = {
            "messages": 0,
            "records": 0,
            "bad_messages": 0,
            "bad_records": 0,
            "connections": 0,
            "disconnects": 0,
            "control_sent": 0,
            "control_failed": 0,
            "refused": 0,
            "handshake_incomplete": 0,  # a connection that never finished its handshake
            "bytes": 0,  # frame bytes received
            "frames_rejected": 0,  # frames refused as a whole (impossible count or shape)
            "backlog_dropped": 0,  # frames of a peer over BACKLOG_PEER_BYTES, dropped unread
            "backlog_full": 0,  # reads stopped as BACKLOG_TOTAL_BYTES were waiting
            "routes_evicted": 0,  # MAX_ROUTES reached: the oldest route was dropped
            "peer_ranks_capped": 0,  # MAX_RANKS_PER_PEER reached on one connection
        }
        self.peers = Peers(self.totals)
        self.problems = Problems(self.totals, log)
        self.refused: dict[str, int] = {}  # refused handshakes by kind (curve.HANDSHAKE_FAILED)
        self._closed = False
        self._empty_at = time.time()  # when the socket was last seen empty
        self._stamp = 0.0  # the stamp of the item being decoded

    # --- receiving --------------------------------------------------------------------------

    def recv(self, timeout_ms: int) -> list[Item]:
        """Wait up to ``timeout_ms`` for traffic, then decode a bounded share of what waits.

        Returns valid records, each peer's in the order it sent them, the peers taken in turn
        (``backlog.py``); a batched frame of one rank's step records comes as one
        ``StepBlock``, a relay's of many ranks' as one ``RanksBlock`` (``frames.py``).
        """
        self._flush_control()
        backlog = self._backlog
        events = dict(self._poller.poll(0 if len(backlog) else timeout_ms))
        if self._monitor in events:
            read_monitor(self._monitor, self.totals, self.refused)
        if self._sock in events:
            self._pull()
        else:
            self._empty_at = time.time()
        out: list[Item] = []
        taken = backlog.take(MAX_BATCH_BYTES, MAX_BATCH_FRAMES)
        while not taken and len(backlog):  # credit grows each round: a few rounds at most
            taken = backlog.take(MAX_BATCH_BYTES, MAX_BATCH_FRAMES)
        count = 0
        # items behind a frame decoded in parts
        later: dict[bytes, list[tuple[float, bytes | _Rest]]] = {}
        rests = self._rests
        for identity, entry in taken:
            if identity in rests:
                later.setdefault(identity, []).append(entry)
            else:
                self._stamp = entry[0]
                count += self._take(identity, entry[1], out)
        for identity, rest in rests.items():  # the rest first, then what came after it
            for entry in reversed(later.get(identity, ())):
                backlog.put_front(identity, entry, _size(entry[1]))
            backlog.put_front(identity, (rest.stamp, rest), rest.size)
        rests.clear()
        self.totals["records"] += count
        return out

    def heard_until(self) -> float:
        """Every frame that reached the socket before this time has been handed out by
        ``recv()`` (or refused): the oldest waiting frame's stamp, else when the socket was
        last seen empty. Costs one look per peer with frames waiting."""
        return min((stamp for stamp, _ in self._backlog.heads()), default=self._empty_at)

    def _pull(self) -> None:
        """Move what the socket holds into the backlog (bounded), counting what cannot go."""
        recv, put, backlog = self._sock.recv_multipart, self._backlog.put, self._backlog
        totals = self.totals
        pulled = 0
        stamp = self._empty_at  # what is read now arrived after it
        for _ in range(MAX_PULL_MESSAGES):
            if backlog.full():
                totals["backlog_full"] += 1
                return
            try:
                parts = recv(zmq.NOBLOCK)
            except zmq.Again:
                self._empty_at = time.time()
                return
            size = sum(map(len, parts))
            totals["bytes"] += size
            if len(parts) != 2 or not put(parts[0], (stamp, parts[1]), len(parts[1])):
                stats = self.peers.get(parts[0])
                stats.messages += 1
                totals["messages"] += 1
                if len(parts) != 2:
                    sent = f"message has {len(parts) - 1} frames, expected 1"
                    self.problems.bad(stats, "frames", sent)
                else:
                    totals["backlog_dropped"] += 1
                    self.problems.bad(
                        stats,
                        "backlog",
                        f"over {BACKLOG_PEER_BYTES} bytes of its frames wait to be decoded, so "
                        f"a frame of {len(parts[1])} bytes was dropped unread (the head asks "
                        "for gaps again; the agent's JSONL keeps every record)",
                    )
            pulled += size
            if pulled >= MAX_PULL_BYTES:
                return

    def _take(self, identity: bytes, item: bytes | _Rest, out: list[Item]) -> int:
        """Decode one frame of ``identity`` (or the next part of one) into ``out``; the number
        of valid records."""
        stats = self.peers.get(identity)
        if isinstance(item, _Rest):
            batch: list[Record] | list[Item] = self._salvage(stats, identity, item)
        else:
            stats.messages += 1
            self.totals["messages"] += 1
            batch = self._decode(stats, identity, item)
        if not batch:
            return 0
        self.peers.saw(identity, stats, batch)
        first = batch[0]
        size = len(batch)
        if type(first) is StepBlock or type(first) is RanksBlock:  # a frame's block is first
            size += len(first) - 1
        stats.records += size
        out.extend(batch)
        return size

    def _decode(
        self, stats: SenderStats, identity: bytes, frame: bytes
    ) -> list[Record] | list[Item]:
        fast = frames.decode_ranks(frame)
        if fast is not None:
            return fast
        try:
            raws = records.frame_maps(frame)
        except DecodeError as exc:
            if exc.reason == "version":
                self.problems.bad_version(stats, frame, exc)
            else:
                self.totals["frames_rejected"] += exc.reason == "records"
                self.problems.bad(stats, exc.reason, str(exc))
            return []
        try:
            return cast("list[Item]", records.decode_maps_blocks(raws))
        except DecodeError:  # a bad record ("field"): keep the others
            return self._salvage(stats, identity, _Rest(raws, 0, len(frame), self._stamp))

    def _salvage(self, stats: SenderStats, identity: bytes, rest: _Rest) -> list[Record]:
        """The valid records of the next SALVAGE_RECORDS of a frame with bad records; what is
        left goes back first in the peer's queue, so one frame's bad records cost the other
        peers at most one part's time at once."""
        raws, start = rest.raws, rest.start
        end = start + SALVAGE_RECORDS
        if end < len(raws):
            size = max(1, rest.size * (len(raws) - end) // len(raws))
            self._rests[identity] = _Rest(raws, end, size, rest.stamp)
        good: list[Record] = []
        bad: dict[str, tuple[int, str]] = {}  # reason -> (count, first message)
        for item in raws[start:end]:
            try:
                good.append(records.decode_record(item))
            except DecodeError as err:
                count, first = bad.get(err.reason, (0, ""))
                if not count:
                    first = f"{err}{whose(item)}"
                bad[err.reason] = (count + 1, first)
        for reason, (count, first) in bad.items():
            self.problems.bad(stats, reason, first, record=True, count=count)
        return good

    # --- control back to a rank --------------------------------------------------------------

    def send_control(self, identity: bytes, message: dict[str, Any]) -> None:
        """Queue a small control map for one agent; sent by the receiving thread."""
        payload = msgpack.packb(message, use_bin_type=True)
        with self._control_lock:
            self._control.append((identity, payload))

    def identity_of(self, run: str, rank: int) -> bytes | None:
        """The identity the latest records of ``(run, rank)`` came from, if any."""
        return self.peers.identity_of(run, rank)

    def request_resend(self, run: str, rank: int, from_seq: int, inc: int = 0) -> bool:
        """Ask the agent of ``(run, rank)`` to re-send its records of incarnation ``inc`` from
        ``from_seq``."""
        identity = self.peers.identity_of(run, rank)
        if identity is None:
            return False
        # run and rank let a relay pass the request on to the right agent; agents ignore them.
        # The base version: agents from before telemetry read it too.
        message = {"v": records.BASE_VERSION, "resend_from": from_seq, "run": run, "rank": rank}
        if inc:  # an agent of this incarnation only (one without any takes none)
            message["inc"] = inc
        self.send_control(identity, message)
        return True

    def send_command(self, run: str, rank: int, message: dict[str, Any]) -> bool:
        """Queue a command map (``wire/commands.py``) for the agent of ``(run, rank)``; False
        when no record of it came in yet (no route)."""
        identity = self.peers.identity_of(run, rank)
        if identity is None:
            return False
        self.send_control(identity, message)
        return True

    def _flush_control(self) -> None:
        if not self._control:
            return
        with self._control_lock:
            pending, self._control = self._control, deque()
        for identity, payload in pending:
            try:
                self._sock.send_multipart([identity, payload], zmq.NOBLOCK)
                self.totals["control_sent"] += 1
            except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone; EAGAIN: it is full
                self.totals["control_failed"] += 1
                log.debug("control message to %s not sent: %s", identity.hex(), exc)

    # --- reporting ------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        """JSON-ready totals, problems by reason, and per-sender counts (by run/rank label)."""
        # Called from other threads while the receiving thread updates these dicts: each is
        # copied in one C-level call (atomic under the GIL) before it is iterated.
        out = {**self.totals, "reasons": dict(self.problems.reasons)}
        out["senders"] = self.peers.by_label()
        out["refused_by"] = dict(self.refused)
        out["backlog_bytes"] = self._backlog.bytes
        out["peer_buffer_bytes"] = PEER_BUFFER_BYTES
        if self.curve is not None:
            out["curve_clients"] = self.curve.clients
            out["curve_denied_keys"] = self.curve.denied
        return out

    def close(self) -> None:
        """Close the socket (from the thread that used it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(0)
        self._server.close()


@dataclass(slots=True)
class _Rest:
    """The records of a frame still to be decoded one by one, from ``start``."""

    raws: list[Any]
    start: int
    size: int  # its share of the frame's bytes, for the backlog's budgets
    stamp: float  # the frame's (Receiver._backlog)


def _size(item: bytes | _Rest) -> int:
    return item.size if isinstance(item, _Rest) else len(item)
