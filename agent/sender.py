"""The one background thread that owns the ZeroMQ DEALER socket.

The training thread only appends to a bounded ``collections.deque`` (see ``Monitor.log``); this
thread wakes every ``FLUSH_INTERVAL_S`` (or at once when the aggregator sends something), turns
whatever is queued into wire maps, packs them into as few frames as fit under
``records.MAX_FRAME_BYTES`` and sends each with ``zmq.NOBLOCK``. When ZeroMQ's own queue is full
(``zmq.Again``: no aggregator for a long while) the frame stays pending and is retried; the
deque behind it fills and ``Monitor`` counts what it cannot queue. Waking on a timer rather than
on every record keeps the training thread free of any signalling cost and batches records.

ZeroMQ connects and reconnects by itself, so nothing here ever waits for the aggregator; close
gives the socket ``LINGER`` to flush what it holds and always returns within its timeout.

A frame ``{"v": 1, "resend_from": seq, "inc": inc}`` from the aggregator makes this thread re-read
the JSONL file from that seq and send those records of this incarnation again (the aggregator
drops duplicates); a request for another incarnation (an earlier process of this rank) is ignored.
A request without ``inc`` (an older aggregator) means this process's own. A control map with
``cmd`` is a command (``wire/commands.py``): it goes to ``on_command`` (the Monitor's command
state), or is ignored with a warning when there is none.

With CurveZMQ keys (``RANKWATCH_CURVE_DIR``: ``server.key`` and this node's client secret, made
by ``rankwatch keys``) the socket encrypts everything and proves its key to the aggregator.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import zmq

from . import reach
from .fallback import read_records
from .wire.commands import is_command
from .wire.curve import CurveKeys
from .wire.records import (
    BASE_VERSION,
    MAX_FRAME_BYTES,
    SCHEMA_VERSION,
    Record,
    encode_frame,
    frame_groups,
    to_wire,
)

log = logging.getLogger("rankwatch.agent")

FLUSH_INTERVAL_S = 0.02  # how often queued records are sent (latency on the dashboard)
MAX_BATCH_RECORDS = 2000  # records per frame before size splitting
SNDHWM_FRAMES = 256  # frames ZeroMQ holds for an absent aggregator before zmq.Again
LINGER_MS = 1000  # how long close lets ZeroMQ flush
RECONNECT_IVL_MS = 200
RECONNECT_IVL_MAX_MS = 5000
ZMTP_HEARTBEAT_MS = 2000  # detect a silently vanished aggregator and reconnect
ZMTP_HEARTBEAT_TIMEOUT_MS = 6000
MAX_RESEND_RECORDS = 1_000_000  # one resend request re-sends at most this many records

STEP = "s"  # tag of a step tuple in the queue: (STEP, seq, time, step, epoch, metrics)


class Sender:
    """Sends queued records to ``addr`` from a daemon thread.

    ``queue`` holds step tuples (see ``STEP``) or ready wire maps (events). ``step_base`` holds
    the constant fields of a step record (``inc`` among them when not 0). ``heartbeat`` makes
    one heartbeat wire map (called in this thread every ``heartbeat_s``); ``on_drop`` counts
    records that could not be sent at all.
    """

    def __init__(
        self,
        addr: str,
        queue: deque[Any],
        step_base: dict[str, Any],
        heartbeat: Callable[[], dict[str, Any] | None],
        heartbeat_s: float,
        on_drop: Callable[[int], None],
        jsonl: Path | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        curve: CurveKeys | None = None,
        unreachable_after_s: float | None = None,
        on_command: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.addr = addr
        self._on_command = on_command
        after_s = reach.UNREACHABLE_AFTER_S if unreachable_after_s is None else unreachable_after_s
        self._reach = reach.Reachability(addr, jsonl, after_s, time.monotonic())
        self._curve = curve
        self.queue = queue
        self.sent_frames = 0
        self.sent_records = 0
        self.resends = 0
        self._base = step_base
        self._inc = step_base.get("inc", 0)
        self._heartbeat = heartbeat
        self._heartbeat_s = heartbeat_s
        self._on_drop = on_drop
        self._jsonl = jsonl
        self._flush_s = flush_interval_s
        # Packed frames (with their record counts) that ZeroMQ refused with zmq.Again.
        self._pending: deque[tuple[bytes, int]] = deque()
        self._resend: Iterator[Record] | None = None
        self._stop = threading.Event()
        self._beat_now = threading.Event()
        self._deadline = 0.0  # monotonic time by which the thread must have closed
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="rankwatch-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat_now(self) -> None:
        """Send a heartbeat on the next wake (a pause or resume changes what it says)."""
        self._beat_now.set()

    def close(self, timeout_s: float) -> bool:
        """Flush what can be flushed and stop; True when the thread ended in time."""
        if not self._thread.is_alive():
            return True
        self._deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._thread.join(timeout_s + 0.1)
        return not self._thread.is_alive()

    # --- the thread ----------------------------------------------------------------------

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _run(self) -> None:
        ctx = zmq.Context(1)
        sock = ctx.socket(zmq.DEALER)
        watch: reach.HandshakeWatch | None = None
        try:
            self._configure(sock)
            watch = reach.HandshakeWatch(sock)
            sock.connect(self.addr)
            self._loop(sock, watch)
        except Exception as exc:  # the thread must never take training down with it
            log.exception("rankwatch: sender thread stopped: %s", exc)
        finally:
            if watch is not None:
                watch.close()
            linger = int(max(0.0, min(LINGER_MS / 1000, self._deadline - time.monotonic())) * 1e3)
            sock.close(linger=linger if self._deadline else 0)
            ctx.term()

    def _configure(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.SNDHWM, SNDHWM_FRAMES)
        sock.setsockopt(zmq.RCVHWM, 100)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMTP_HEARTBEAT_TIMEOUT_MS)
        sock.setsockopt(zmq.MAXMSGSIZE, 64 * 1024)  # control frames from the aggregator are tiny
        if self._curve is not None:
            sock.curve_publickey = self._curve.public
            sock.curve_secretkey = self._curve.secret
            sock.curve_serverkey = self._curve.server

    def _loop(self, sock: zmq.Socket[bytes], watch: reach.HandshakeWatch) -> None:
        next_beat = time.monotonic() + self._heartbeat_s
        while True:
            stopping = self._stop.is_set()
            now = time.monotonic()
            self._watch_reach(watch, now)
            if now >= next_beat or self._beat_now.is_set():
                self._beat_now.clear()
                beat = self._heartbeat()
                if beat is not None:
                    self.queue.append(beat)
                next_beat = now + self._heartbeat_s
            self._send_all(sock)
            if stopping:
                return
            if sock.poll(int(self._flush_s * 1000)):
                self._receive(sock)

    def _watch_reach(self, watch: reach.HandshakeWatch, now: float) -> None:
        for event in watch.events():
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if message := self._reach.handshake(now):
                    log.warning(message)
            else:
                self._reach.disconnected(now)
        if message := self._reach.tick(now):
            log.warning(message)

    def _send_all(self, sock: zmq.Socket[bytes]) -> None:
        if not self._send_pending(sock):
            return  # ZeroMQ's queue is full: keep the frames, leave the deque alone
        while batch := self._take():
            for part in frame_groups(batch):  # telemetry in frames of its own
                self._pending.extend(self._pack(part))
            if not self._send_pending(sock):
                return

    def _send_pending(self, sock: zmq.Socket[bytes]) -> bool:
        while self._pending:
            frame, count = self._pending[0]
            try:
                sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return False
            except zmq.ZMQError as exc:
                self._warn_once("send", "rankwatch: sending to %s failed: %s", self.addr, exc)
                return False
            self._pending.popleft()
            self.sent_frames += 1
            self.sent_records += count
        return True

    def _take(self) -> list[dict[str, Any]]:
        """Up to MAX_BATCH_RECORDS wire maps: resent records first, then the queue."""
        out: list[dict[str, Any]] = []
        if self._resend is not None:
            out.extend(to_wire(r) for r in itertools.islice(self._resend, MAX_BATCH_RECORDS))
            if len(out) < MAX_BATCH_RECORDS:
                self._resend = None
            if out:
                return out
        queue, base = self.queue, self._base
        popleft = queue.popleft
        while queue and len(out) < MAX_BATCH_RECORDS:
            item = popleft()
            if type(item) is tuple:
                _, seq, t, step, epoch, metrics = item
                wire = base.copy()
                wire["seq"] = seq
                wire["time"] = t
                wire["step"] = step
                wire["epoch"] = epoch
                wire["metrics"] = metrics
                out.append(wire)
            else:
                out.append(item)
        return out

    def _pack(self, batch: list[dict[str, Any]]) -> Iterator[tuple[bytes, int]]:
        try:
            frame = encode_frame(batch)
        except Exception as exc:  # a value msgpack cannot pack: find and drop that record
            if len(batch) == 1:
                self._on_drop(1)
                self._warn_once("pack", "rankwatch: a record could not be packed: %s", exc)
                return
            frame = b""
        if frame and len(frame) <= MAX_FRAME_BYTES:
            yield frame, len(batch)
            return
        if len(batch) == 1:
            self._on_drop(1)
            self._warn_once(
                "size", "rankwatch: a record of %d bytes exceeds the frame limit", len(frame)
            )
            return
        half = len(batch) // 2
        yield from self._pack(batch[:half])
        yield from self._pack(batch[half:])

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        for _ in range(100):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = msgpack.unpackb(frame, raw=False)
                version, start = msg.get("v"), msg.get("resend_from")
                inc = msg.get("inc", self._inc)
            except Exception:
                self._warn_once("control", "rankwatch: ignored a malformed control frame")
                continue
            if is_command(msg) and self._on_command is not None:
                try:
                    self._on_command(msg)
                except Exception as exc:  # a bug there must not cost the sender thread
                    self._warn_once("command", "rankwatch: a command failed: %r", exc)
                continue
            known = version in (BASE_VERSION, SCHEMA_VERSION)
            if not known or type(start) is not int or self._jsonl is None:
                self._warn_once("control", "rankwatch: ignored control frame %r", msg)
                continue
            if inc != self._inc:  # meant for an earlier process of this rank
                continue
            self.resends += 1
            log.info("rankwatch: aggregator asked to resend from seq %d", start)
            self._resend = itertools.islice(
                read_records(self._jsonl, max(1, start), self._inc), MAX_RESEND_RECORDS
            )
