"""The ZeroMQ ROUTER the agents' DEALER sockets connect to.

Thin on purpose: receive ``[identity, frame]`` messages in batches, decode them with the wire
schema, count what arrives per sender and per problem, and hand the records to the service.
Bad input (not msgpack, wrong schema, extra frames, a newer schema version) is counted and
logged once per sender and reason; it is never fatal and valid traffic keeps flowing. A newer
schema version is its own log line, once per sender and version, whatever that sender got wrong
before: it is the one problem an operator fixes on the head node (upgrade the aggregator).

Everything kept per peer is bounded, so a peer inventing run names or reconnecting at will
costs counts, not memory: ``MAX_SENDERS`` identities, ``MAX_ROUTES`` (run, rank) routes in
all and ``MAX_RANKS_PER_PEER`` per connection (a relay's oldest rank route gives way to its
newest), ``MAX_RETIRED`` labels of evicted identities, ``MAX_LOGGED`` log-once keys.

The socket belongs to the thread that calls ``recv()``: ``send_control()`` may be called from
any thread, it only queues, and the queue is flushed by the next ``recv()``.

With ``curve_dir`` the socket is a CurveZMQ server (see ``curve.py``): traffic is encrypted and
only agents holding an allowed client key get in; refused handshakes are counted in
``refused`` (a peer without curve, or with an unknown key).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.addresses import DEFAULT_INGEST_PORT
from rankwatch.agent.wire.curve import HANDSHAKE_FAILED, CurveGate, ServerContext
from rankwatch.agent.wire.records import DecodeError, Record, StepBlock
from rankwatch.aggregator.ingest import frames
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("rankwatch.receiver")


MAX_BATCH_MESSAGES = 2000  # messages drained per recv() before returning to the service
MAX_BATCH_RECORDS = 5000  # ... or records: bounds how long the service holds its lock
RCVHWM_MESSAGES = 100_000  # per-peer inbound buffer, so a slow store tick does not push back
MAX_SENDERS = 4096  # per-identity counters kept; DEALERs get a new identity on each reconnect
MAX_RETIRED = 4096  # labels of evicted identities kept apart; the rest share OTHER_SENDERS
OTHER_SENDERS = "(others)"
MAX_ROUTES = 65_536  # (run, rank) -> identity routes for resend requests, in all ...
MAX_RANKS_PER_PEER = 1024  # ... and per connection (a relay carries a node's ranks, every run)
MAX_LOGGED = 10_000  # (sender, reason) pairs already logged, to log each once
LINGER_MS = 0  # control messages are best effort: never hang on close
# Monitor events: connections come and go; a failed handshake is a refused peer.
MONITOR_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED
for _event in HANDSHAKE_FAILED:
    MONITOR_EVENTS |= _event


@dataclass(slots=True)
class SenderStats:
    label: str  # "run/rank" once a valid record came from this identity, else identity hex
    run: str | None = None
    rank: int | None = None
    messages: int = 0
    records: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    relayed: bool = False  # one connection carrying several ranks (a `rankwatch relay`)
    # (run, rank) routed through this identity, oldest first (dict as an ordered set)
    ranks: dict[tuple[str, int], None] = field(default_factory=dict)


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
        self._control: deque[tuple[bytes, bytes]] = deque()
        self._control_lock = threading.Lock()
        self._senders: dict[bytes, SenderStats] = {}
        self._routes: dict[tuple[str, int], bytes] = {}  # (run, rank) -> latest identity
        self._logged: set[tuple[str, str, str]] = set()  # (sender, reason, detail)
        self._retired: dict[str, SenderStats] = {}  # stats of evicted identities, by label
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
            "routes_evicted": 0,  # MAX_ROUTES reached: the oldest route was dropped
            "peer_ranks_capped": 0,  # MAX_RANKS_PER_PEER reached on one connection
        }
        self.reasons: dict[str, int] = {}
        self.refused: dict[str, int] = {}  # refused handshakes by kind (HANDSHAKE_FAILED)
        self._closed = False

    # --- receiving --------------------------------------------------------------------------

    def recv(self, timeout_ms: int) -> list[Record | StepBlock]:
        """Wait up to ``timeout_ms`` for traffic, then drain what is queued (bounded).

        Returns the valid records of every message received, in arrival order; a batched
        frame of one rank's step records comes as one ``StepBlock``.
        """
        self._flush_control()
        out: list[Record | StepBlock] = []
        events = dict(self._poller.poll(timeout_ms))
        if self._monitor in events:
            self._read_monitor()
        if self._sock not in events:
            return out
        recv = self._sock.recv_multipart
        decode = frames.decode_frame_blocks
        senders = self._senders
        n = count = 0
        while n < MAX_BATCH_MESSAGES and count < MAX_BATCH_RECORDS:
            try:
                parts = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            identity = parts[0]
            stats = senders.get(identity)
            if stats is None:
                stats = self._new_sender(identity)
            stats.messages += 1
            if len(parts) != 2:
                self._bad(stats, "frames", f"message has {len(parts) - 1} frames, expected 1")
                continue
            try:
                batch: list[Record] | list[Record | StepBlock] = decode(parts[1])
            except DecodeError as exc:
                batch = self._salvage(stats, parts[1], exc)
                if not batch:
                    continue
            if stats.run is None and batch:
                self._learn(identity, stats, batch[0])
            if batch and (stats.relayed or batch[-1].rank != stats.rank):
                # A relay: every rank behind it is reached through this one identity.
                stats.relayed = True
                routes = self._routes
                for rec in batch:
                    key = (rec.run, rec.rank)
                    if routes.get(key) != identity:
                        self._route(key, identity, stats)
            size = len(batch[0]) if batch and type(batch[0]) is StepBlock else len(batch)
            stats.records += size
            count += size
            out.extend(batch)
        self.totals["messages"] += n
        self.totals["records"] += count
        return out

    def _salvage(self, stats: SenderStats, frame: bytes, exc: DecodeError) -> list[Record]:
        """A frame failed to decode: keep its valid records when only some records are bad."""
        if exc.reason == "version":
            self._bad_version(stats, frame, exc)
            return []
        if exc.reason != "field":
            self._bad(stats, exc.reason, str(exc))
            return []
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=0)
        good: list[Record] = []
        for item in raw["records"]:
            try:
                good.append(records.decode_record(item))
            except DecodeError as bad:
                self._bad(stats, bad.reason, str(bad), record=True)
        return good

    def _bad_version(self, stats: SenderStats, frame: bytes, exc: DecodeError) -> None:
        version = _frame_version(frame)
        if version is None or version <= records.SCHEMA_VERSION:
            self._bad(stats, "version", str(exc))
            return
        self._bad(
            stats,
            "version",
            f"it sends wire schema version {version}, newer than this aggregator's "
            f"{records.SCHEMA_VERSION}: upgrade rankwatch on the head node (`pip install -U "
            "rankwatch`, then restart `rankwatch serve`); until then its records are dropped "
            "and counted",
            detail=f"newer {version}",
            level=logging.ERROR,
        )

    def _new_sender(self, identity: bytes) -> SenderStats:
        if len(self._senders) >= MAX_SENDERS:
            # Reconnecting DEALERs get fresh identities; fold the oldest into per-label totals.
            oldest = next(iter(self._senders))
            self._retire(self._senders.pop(oldest))
        stats = SenderStats(label=identity.hex())
        self._senders[identity] = stats
        return stats

    def _retire(self, stats: SenderStats) -> None:
        # Its routes stay (they are bounded by MAX_ROUTES and the identity may speak again).
        label = stats.label
        if label not in self._retired and len(self._retired) >= MAX_RETIRED:
            label = OTHER_SENDERS  # a peer making up names must not grow this without end
        blank = SenderStats(label, stats.run, stats.rank)
        kept = self._retired.setdefault(label, blank)
        kept.messages += stats.messages
        kept.records += stats.records
        for reason, count in stats.bad.items():
            kept.bad[reason] = kept.bad.get(reason, 0) + count

    def _learn(self, identity: bytes, stats: SenderStats, rec: Record | StepBlock) -> None:
        stats.run, stats.rank = rec.run, rec.rank
        stats.label = f"{rec.run}/{rec.rank}"
        if self._routes.get((rec.run, rec.rank)) != identity:
            self._route((rec.run, rec.rank), identity, stats)

    def _route(self, key: tuple[str, int], identity: bytes, stats: SenderStats) -> None:
        """Route resends for ``key`` to ``identity`` (newest last), within both bounds."""
        routes = self._routes
        owner = routes.pop(key, None)
        if owner is not None:  # the rank moved (reconnect, or now behind a relay)
            moved = self._senders.get(owner)
            if moved is not None:
                moved.ranks.pop(key, None)
        elif len(routes) >= MAX_ROUTES:
            gone, gone_owner = next(iter(routes.items()))
            del routes[gone]
            self.totals["routes_evicted"] += 1
            held = self._senders.get(gone_owner)
            if held is not None:
                held.ranks.pop(gone, None)
        if len(stats.ranks) >= MAX_RANKS_PER_PEER:
            # One connection naming more ranks than a node has: its own oldest route goes,
            # not another peer's, and a long-lived relay still reaches its newest runs.
            gone = next(iter(stats.ranks))
            del stats.ranks[gone]
            routes.pop(gone, None)
            self.totals["peer_ranks_capped"] += 1
        routes[key] = identity
        stats.ranks[key] = None

    def _bad(
        self,
        stats: SenderStats,
        reason: str,
        message: str,
        record: bool = False,
        *,
        detail: str = "",
        level: int = logging.WARNING,
    ) -> None:
        """Count a problem; log it once per (sender, reason, detail)."""
        stats.bad[reason] = stats.bad.get(reason, 0) + 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        self.totals["bad_records" if record else "bad_messages"] += 1
        key = (stats.label, reason, detail)
        logged = self._logged
        if key in logged:
            return
        if len(logged) >= MAX_LOGGED:
            if len(logged) == MAX_LOGGED:  # say once that the log goes quiet, and why
                logged.add(("", "", "full"))
                log.warning(
                    "%d distinct (sender, problem) pairs logged; further bad input is only "
                    "counted (rankwatch_aggregator_ingest_errors on /metrics)",
                    MAX_LOGGED,
                )
            return
        logged.add(key)
        if detail.startswith("newer"):
            log.log(level, "agent %s: %s", stats.label, message)
            return
        what = "record" if record else "message"
        log.log(
            level,
            "dropped a bad %s from agent %s (%s): %s; further %r problems from this "
            "sender are only counted",
            what,
            stats.label,
            reason,
            message[:300],
            reason,
        )

    def _read_monitor(self) -> None:
        while True:
            try:
                msg = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(msg)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self.totals["disconnects"] += 1
            elif event == zmq.EVENT_ACCEPTED:
                self.totals["connections"] += 1
            elif event in HANDSHAKE_FAILED:
                kind = HANDSHAKE_FAILED[event]
                self.totals["refused"] += 1
                self.refused[kind] = self.refused.get(kind, 0) + 1

    # --- control back to a rank --------------------------------------------------------------

    def send_control(self, identity: bytes, message: dict[str, Any]) -> None:
        """Queue a small control map for one agent; sent by the receiving thread."""
        payload = msgpack.packb(message, use_bin_type=True)
        with self._control_lock:
            self._control.append((identity, payload))

    def identity_of(self, run: str, rank: int) -> bytes | None:
        """The identity the latest records of ``(run, rank)`` came from, if any."""
        return self._routes.get((run, rank))

    def request_resend(self, run: str, rank: int, from_seq: int, inc: int = 0) -> bool:
        """Ask the agent of ``(run, rank)`` to re-send its records of incarnation ``inc`` from
        ``from_seq``."""
        identity = self._routes.get((run, rank))
        if identity is None:
            return False
        # run and rank let a relay pass the request on to the right agent; agents ignore them.
        message = {"v": records.SCHEMA_VERSION, "resend_from": from_seq, "run": run, "rank": rank}
        if inc:  # an agent of this incarnation only (one without any takes none)
            message["inc"] = inc
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
        by_label: dict[str, dict[str, Any]] = {}
        for stats in [*self._retired.values(), *self._senders.values()]:
            entry = by_label.setdefault(stats.label, {"messages": 0, "records": 0, "bad": {}})
            entry["messages"] += stats.messages
            entry["records"] += stats.records
            for reason, count in dict(stats.bad).items():
                entry["bad"][reason] = entry["bad"].get(reason, 0) + count
        out = {**self.totals, "reasons": dict(self.reasons), "senders": by_label}
        out["refused_by"] = dict(self.refused)
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


def _frame_version(frame: bytes) -> int | None:
    """The ``v`` of a frame that decoded as far as its version check (so it is a msgpack map)."""
    try:
        envelope = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=0)
    except Exception:  # msgpack raises several unrelated types
        return None
    version = envelope.get("v") if isinstance(envelope, dict) else None
    return version if type(version) is int else None
