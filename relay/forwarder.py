"""A per-node relay: this node's agents connect to it, it forwards to the head node in batches.

    ranks (DEALER) --> relay ROUTER --[re-batched frames, one DEALER]--> head aggregator ROUTER

With thousands of ranks the head node otherwise holds one TCP connection per rank and decodes one
small frame per rank per step. A relay on every node turns that into one connection per node and
one frame per node every ``batch_ms``. It decodes frames only as far as it must: msgpack-unpack
the envelope, check the schema version, and concatenate the ``records`` lists; records themselves
are validated by the head, as always. Frames that are not msgpack, not an envelope, of a newer
schema, or whose records cannot be real (more than the frame's bytes hold, or not maps: the
head's own envelope checks, ``records.frame_envelope``) are dropped and counted, never fatal.

Bounded: at most ``max_pending_bytes`` of packed frames wait for the head. When that is reached
(the head is away) the relay stops reading from its agents, so the back-pressure reaches them:
they queue, then count drops, and their JSONL files keep every record for a resend or an import.

Control messages from the head (a resend request) go back to the agent that sent the rank's
records when they name ``run`` and ``rank``; otherwise the relay cannot tell which of its ranks is
meant and counts them as ``control_unroutable``. At most ``MAX_ROUTES`` (run, rank) routes are
kept; beyond, the oldest goes (``routes_evicted``).

With ``curve_dir`` (``rankwatch relay --curve DIR``, DIR a copy of the head's key directory)
both sides are CurveZMQ: the relay requires an allowed client key from its agents, exactly as
the head does (refused handshakes are counted in ``refused``), and authenticates to the head
with ``client.key_secret``. See ``curve.py``.

One thread owns both sockets. ``counters()`` may be read from any thread.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import msgpack
import zmq
from rankwatch.agent.wire.addresses import DEFAULT_INGEST_PORT, parse_addr, resolve_addr
from rankwatch.agent.wire.curve import (
    MONITOR_EVENTS,
    CurveGate,
    ServerContext,
    client_keys_of,
    configure_client,
    read_monitor,
)
from rankwatch.agent.wire.records import MAX_FRAME_BYTES, DecodeError, frame_envelope

log = logging.getLogger("rankwatch.relay")

DEFAULT_LISTEN = f"tcp://*:{DEFAULT_INGEST_PORT}"
DEFAULT_BATCH_MS = 50  # records wait at most this long in the relay (dashboard latency)
FLUSH_BYTES = 1024 * 1024  # a batch is sent at once when its frames reach this size
FRAME_HEADROOM = 64 * 1024  # a batch never grows past MAX_FRAME_BYTES minus this
MAX_PENDING_BYTES = 64 * 1024 * 1024  # packed frames held for an absent head; then push back
MAX_DRAIN_MESSAGES = 1000  # agent messages handled per loop turn before sending
RCVHWM_MESSAGES = 10_000  # per-agent inbound queue
# Upstream frames ZeroMQ itself holds (even before the head ever connected) before zmq.Again;
# small, so the relay's own bounded queue and its push-back take over soon.
SNDHWM_FRAMES = 16
IDLE_POLL_MS = 100
STOP_TIMEOUT_S = 5.0  # stop() flushes to the head for at most this long
RECONNECT_IVL_MS = 200
RECONNECT_IVL_MAX_MS = 5000
ZMTP_HEARTBEAT_MS = 2000  # notice a vanished head and reconnect
ZMTP_HEARTBEAT_TIMEOUT_MS = 6000
MAX_ROUTES = 65_536  # (run, rank) -> agent identity entries kept for control messages
MAX_LOGGED = 1000  # (sender, reason) pairs logged once each
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "0.0.0.0", "*")


def listen_endpoint(value: str) -> str:
    """``tcp://*:8671``, ``ipc://path``, ``host:port`` or a bare port, as a ZeroMQ bind endpoint."""
    raw = value.strip()
    if not raw:
        raise ValueError("listen address is empty")
    if raw.startswith("ipc://"):
        return raw
    if raw.isdigit():
        raw = f"*:{raw}"
    rest = raw.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise ValueError(f"listen address {value!r}: expected tcp://HOST:PORT, HOST:PORT or PORT")
    if port in ("*", "0"):
        return f"tcp://{host}:*"  # libzmq's spelling of "any free port"
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"listen address {value!r} has a bad port {port!r}")
    return f"tcp://{host}:{int(port)}"


def upstream_endpoint(explicit: str | None, env: dict[str, str], listen: str) -> str:
    """The head's address like an agent finds it: explicit, else RANKWATCH_ADDR, else
    MS_SCHED_HOST / MASTER_ADDR at the default port. Refuses this relay's own address."""
    try:
        addr = parse_addr(explicit) if explicit is not None else resolve_addr(None, env)
    except ValueError as exc:
        raise ValueError(f"upstream: {exc}") from None
    if addr is None:
        raise ValueError(
            "no upstream: pass --upstream HEAD[:PORT] or set RANKWATCH_ADDR, MS_SCHED_HOST "
            "or MASTER_ADDR"
        )
    if _is_self(addr, listen):
        raise ValueError(
            f"upstream {addr} is this relay's own listen address {listen} (RANKWATCH_ADDR points "
            "this node's agents at the relay); pass --upstream with the head node's address"
        )
    return addr


def _is_self(addr: str, listen: str) -> bool:
    if addr.startswith("ipc://") or listen.startswith("ipc://"):
        return addr == listen
    host, _, port = addr.removeprefix("tcp://").rpartition(":")
    l_host, _, l_port = listen.removeprefix("tcp://").rpartition(":")
    if port != l_port:
        return False
    own = {*LOOPBACK, socket.gethostname()}  # no getfqdn(): it may wait on DNS
    return host == l_host or (host in own and l_host in ("*", "0.0.0.0", "::", host))


class Relay:
    """Bind ``listen`` for agents, connect ``upstream``; ``start()`` runs the forwarding thread."""

    def __init__(
        self,
        listen: str = DEFAULT_LISTEN,
        upstream: str = f"tcp://127.0.0.1:{DEFAULT_INGEST_PORT}",
        *,
        batch_ms: float = DEFAULT_BATCH_MS,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        context: zmq.Context[Any] | None = None,
        curve_dir: Path | str | None = None,
    ) -> None:
        if not batch_ms >= 0:
            raise ValueError(f"batch_ms must be >= 0, got {batch_ms}")
        if max_pending_bytes < MAX_FRAME_BYTES:
            raise ValueError(f"max_pending_bytes must be >= {MAX_FRAME_BYTES}")
        self.batch_s = batch_ms / 1000
        self.max_pending_bytes = max_pending_bytes
        self.upstream = upstream
        # CurveError names a missing key file before anything is made or bound.
        client = client_keys_of(curve_dir) if curve_dir is not None else None
        self._server = ServerContext(context, curve_dir)
        self._ctx = self._server.context
        self.curve: CurveGate | None = self._server.gate
        down = self._ctx.socket(zmq.ROUTER)
        self._server.configure(down)
        down.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        down.setsockopt(zmq.RCVHWM, RCVHWM_MESSAGES)
        down.setsockopt(zmq.LINGER, 0)
        down.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable control raises: it is counted
        endpoint = listen_endpoint(listen)
        try:
            down.bind(endpoint)
        except zmq.ZMQError as exc:
            down.close(0)
            self._server.close()
            raise OSError(f"relay cannot listen on {endpoint}: {exc}") from None
        self.endpoint = down.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(self.endpoint.rsplit(":", 1)[1]) if self.endpoint.startswith("tcp") else 0
        up = self._ctx.socket(zmq.DEALER)
        for opt, value in (
            (zmq.SNDHWM, SNDHWM_FRAMES),
            (zmq.RCVHWM, 1000),
            (zmq.LINGER, 0),
            (zmq.IPV6, 1),
            (zmq.RECONNECT_IVL, RECONNECT_IVL_MS),
            (zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS),
            (zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS),
            (zmq.HEARTBEAT_TIMEOUT, ZMTP_HEARTBEAT_TIMEOUT_MS),
            (zmq.MAXMSGSIZE, 64 * 1024),  # control messages from the head are tiny
        ):
            up.setsockopt(opt, value)
        if client is not None:
            configure_client(up, client)
        up.connect(upstream)
        self._down, self._up = down, up
        self._monitor = down.get_monitor_socket(MONITOR_EVENTS)
        self._batch: list[Any] = []
        self._batch_bytes = 0
        self._batch_version = 0
        self._deadline = 0.0  # monotonic time the open batch must be sent by
        self._pending: deque[tuple[bytes, int]] = deque()  # packed frames not yet sent upstream
        # oldest first; OrderedDict drops its oldest in O(1) (a dict scans past deleted keys)
        self._routes: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._logged: set[tuple[str, str]] = set()
        self.n: dict[str, int] = dict.fromkeys(
            (
                "frames_in", "records_in", "frames_out", "records_out", "bad_frames",
                "connections", "disconnects", "control_in", "control_routed",
                "control_unroutable", "control_failed", "pushback", "internal_errors",
                "refused", "handshake_incomplete", "routes_evicted",
            ),
            0,
        )  # fmt: skip
        self.reasons: dict[str, int] = {}
        self.refused_by: dict[str, int] = {}  # refused agent handshakes by kind (curve)
        self._reasons_lock = threading.Lock()
        self.pending_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_timeout = STOP_TIMEOUT_S

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rankwatch-relay", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Forward what is held (for at most ``timeout_s``), close. True when all was sent."""
        self._flush_timeout = timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s + 2.0)
        else:
            self._close(timeout_s)
        return not self._pending and not self._batch

    def counters(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.n)
        with self._reasons_lock:  # the relay thread may add a reason meanwhile
            reasons, refused_by = dict(self.reasons), dict(self.refused_by)
        out.update(
            pending_frames=len(self._pending), pending_bytes=self.pending_bytes, reasons=reasons,
            refused_by=refused_by, routes=len(self._routes),
        )  # fmt: skip
        if self.curve is not None:
            out["curve_denied_keys"] = self.curve.denied
        return out

    # --- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._up, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        reading = False
        try:
            while not self._stop.is_set():
                full = self.pending_bytes >= self.max_pending_bytes
                if full == reading:  # (un)register agents' socket as the back-pressure changes
                    reading = not full
                    if reading:
                        poller.register(self._down, zmq.POLLIN)
                    else:
                        poller.unregister(self._down)
                        self.n["pushback"] += 1
                try:
                    events = dict(poller.poll(self._wait_ms()))
                    if self._down in events:
                        self._drain()
                    if self._up in events:
                        self._control()
                    if self._monitor in events:
                        with self._reasons_lock:  # counters() copies refused_by meanwhile
                            read_monitor(self._monitor, self.n, self.refused_by)
                    if self._batch and (
                        time.monotonic() >= self._deadline or self._batch_bytes >= FLUSH_BYTES
                    ):
                        self._seal()
                    self._send_pending()
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.ETERM:
                        return  # the context is being terminated: nothing can be sent
                    self._internal_error(exc)
                except Exception as exc:  # a bug costs one message, never the relay
                    self._internal_error(exc)
        finally:
            self._close(self._flush_timeout)

    def _wait_ms(self) -> int:
        if self._pending:
            return 10  # the head is slow or away: retry soon
        if self._batch:  # wake for the batch deadline, and often enough to notice stop()
            left_ms = int((self._deadline - time.monotonic()) * 1000) + 1
            return max(0, min(left_ms, IDLE_POLL_MS))
        return IDLE_POLL_MS

    def _close(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            if self._batch:
                self._seal()
            while self._pending and time.monotonic() < deadline:
                if not self._send_pending():
                    time.sleep(0.01)
        finally:
            left = max(0.0, deadline - time.monotonic())
            self._down.disable_monitor()
            self._monitor.close(0)
            self._down.close(0)
            self._up.close(int(left * 1000))  # let ZeroMQ deliver what it already holds
            self._server.close()  # an own context waits for the upstream socket's linger

    def _internal_error(self, exc: Exception) -> None:
        self.n["internal_errors"] += 1
        self._log_once("relay", type(exc).__name__, f"internal error: {exc!r}")

    # --- agents -> relay -----------------------------------------------------------------

    def _drain(self) -> None:
        recv = self._down.recv_multipart
        for _ in range(MAX_DRAIN_MESSAGES):
            try:
                parts = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.n["frames_in"] += 1
            if len(parts) != 2:
                self._bad(parts[0], "frames", f"message has {len(parts) - 1} frames, expected 1")
                continue
            self._take(parts[0], parts[1])
            if self.pending_bytes >= self.max_pending_bytes:
                return

    def _take(self, identity: bytes, frame: bytes) -> None:
        try:  # the head's own envelope checks: a frame it would refuse whole goes no further
            version, recs = frame_envelope(frame)
        except DecodeError as exc:
            self._bad(identity, exc.reason, str(exc))
            return
        if not recs:
            return
        self.n["records_in"] += len(recs)
        first = recs[0]
        if isinstance(first, dict):
            run, rank = first.get("run"), first.get("rank")
            if isinstance(run, str) and type(rank) is int:
                self._route(run, rank, identity)
        size = len(frame)
        if self._batch and (
            version != self._batch_version
            or self._batch_bytes + size > MAX_FRAME_BYTES - FRAME_HEADROOM
        ):
            self._seal()
        if not self._batch:
            self._deadline = time.monotonic() + self.batch_s
            self._batch_version = version
        self._batch.extend(recs)
        self._batch_bytes += size
        if self._batch_bytes >= FLUSH_BYTES:  # keeps frames to the head near FLUSH_BYTES
            self._seal()

    def _route(self, run: str, rank: int, identity: bytes) -> None:
        routes = self._routes
        key = (run, rank)
        if routes.get(key) != identity:
            # A moved rank goes to the end; a new one past the cap pushes out the oldest.
            if routes.pop(key, None) is None and len(routes) >= MAX_ROUTES:
                routes.popitem(last=False)
                self.n["routes_evicted"] += 1
            routes[key] = identity

    def _bad(self, identity: bytes, reason: str, message: str) -> None:
        self.n["bad_frames"] += 1
        with self._reasons_lock:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        self._log_once(identity.hex(), reason, f"dropped a bad frame ({reason}): {message[:300]}")

    def _log_once(self, who: str, reason: str, message: str) -> None:
        key = (who, reason)
        if key not in self._logged and len(self._logged) < MAX_LOGGED:
            self._logged.add(key)
            log.warning("rankwatch relay: %s (from %s; further ones only counted)", message, who)

    # --- relay -> head -------------------------------------------------------------------

    def _seal(self) -> None:
        """Pack the open batch into frame(s) for the head."""
        batch, version = self._batch, self._batch_version
        self._batch, self._batch_bytes = [], 0
        for frame, count in _pack(version, batch):
            self._pending.append((frame, count))
            self.pending_bytes += len(frame)

    def _send_pending(self) -> bool:
        """Send held frames; False while ZeroMQ's queue to the head is full."""
        pending, send = self._pending, self._up.send
        while pending:
            frame, count = pending[0]
            try:
                send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return False
            pending.popleft()
            self.pending_bytes -= len(frame)
            self.n["frames_out"] += 1
            self.n["records_out"] += count
        return True

    def _control(self) -> None:
        for _ in range(100):
            try:
                payload = self._up.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.n["control_in"] += 1
            try:
                msg = msgpack.unpackb(payload, raw=False)
                key = (msg.get("run"), msg.get("rank"))
            except Exception:
                key = (None, None)
            identity = self._routes.get(key) if isinstance(key[0], str) else None
            if identity is None:
                self.n["control_unroutable"] += 1
                self._log_once("head", "control", f"control message not routable: {payload!r:.200}")
                continue
            try:
                self._down.send_multipart([identity, payload], zmq.NOBLOCK)
                self.n["control_routed"] += 1
            except zmq.ZMQError:  # the agent is gone (EHOSTUNREACH) or full
                self.n["control_failed"] += 1


def _pack(version: int, batch: list[Any]) -> list[tuple[bytes, int]]:
    frame = msgpack.packb({"v": version, "records": batch}, use_bin_type=True)
    if len(frame) <= MAX_FRAME_BYTES or len(batch) == 1:
        return [(frame, len(batch))]
    half = len(batch) // 2
    return _pack(version, batch[:half]) + _pack(version, batch[half:])
