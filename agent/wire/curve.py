"""Optional CurveZMQ on the ingest port (``rankwatch serve --curve DIR``).

``rankwatch keys --dir DIR`` writes the key files (ZeroMQ certificate format)::

    server.key          server public key      -> every training node (agents check the server)
    server.key_secret   server key pair (0600) -> the head node only
    client.key          client public key      -> stays in DIR: the aggregator allows it
    client.key_secret   client key pair (0600) -> every training node (RANKWATCH_CURVE_DIR)

More clients (``rankwatch keys --client NAME``) add ``client-NAME.key`` files; the aggregator
allows every ``client*.key`` public key in DIR and re-reads DIR when an unknown key knocks, so
a client added later needs no restart. With curve on, traffic is encrypted and a peer without
an allowed key never gets a record in: the ZAP handler (``zmq.auth``) refuses it, and the
receiver counts refused handshakes.

A node relay (``rankwatch relay --curve DIR``) is both: a server to its node's agents, with the
same ``server.key_secret`` and allowed ``client*.key`` files as the head (so the agents' key
directories work unchanged), and a client of the head with ``client.key_secret`` (DIR holds a
copy of the head's key directory; the relay node is trusted like the head).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import zmq

# zmq.auth pulls in asyncio: imported only where keys are used, so an agent without curve
# never pays for it.

log = logging.getLogger("rankwatch.curve")

CURVE_DIR_ENV = "RANKWATCH_CURVE_DIR"
SERVER_PUBLIC = "server.key"  # the aggregator's public key: on every training node
CLIENT_SECRET = "client.key_secret"  # a node's key pair (or one client-NAME.key_secret)
SERVER_SECRET = "server.key_secret"
CLIENT_PUBLIC_GLOB = "client*.key"
RESCAN_MIN_S = 5.0  # an unknown key re-reads the allowed keys at most this often
MAX_LOGGED_KEYS = 100  # refused keys logged by name; beyond this only counted
# Socket monitor events of a refused peer (the receiver and the relay count them by kind).
HANDSHAKE_FAILED: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",  # unknown CurveZMQ client key
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",  # no curve, or not ZeroMQ at all
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other",  # e.g. a keyless agent hanging up on curve
}
# A connection that timed out or was reset before its handshake was done (a port scan, a
# half-open TCP connect) is no refusal: "handshake_incomplete", told apart by the errno.
HANDSHAKE_INCOMPLETE_ERRNOS = frozenset((errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET))
MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
for _event in HANDSHAKE_FAILED:
    MONITOR_EVENTS |= _event


class CurveKeys(NamedTuple):
    public: bytes
    secret: bytes
    server: bytes


def curve_keys(directory: str | os.PathLike[str]) -> CurveKeys:
    """This agent's CurveZMQ keys from ``directory``; ``ValueError`` naming what is missing."""
    import zmq.auth  # only with curve: it pulls in asyncio

    directory = Path(directory).expanduser()
    hint = "make them with `rankwatch keys` and copy server.key and a client secret here"
    if not zmq.has("curve"):
        raise ValueError("CurveZMQ keys given, but this libzmq has no CURVE support")
    secrets = sorted(directory.glob("client*.key_secret"))
    if (directory / CLIENT_SECRET).is_file():
        secrets = [directory / CLIENT_SECRET]
    if len(secrets) != 1:
        found = "none" if not secrets else ", ".join(p.name for p in secrets)
        raise ValueError(f"need one client*.key_secret in {directory} (found {found}); {hint}")
    try:
        public, secret = zmq.auth.load_certificate(secrets[0])
        server, _ = zmq.auth.load_certificate(directory / SERVER_PUBLIC)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read CurveZMQ keys in {directory}: {exc}; {hint}") from None
    if not secret:
        raise ValueError(f"{secrets[0]} holds no secret key; {hint}")
    return CurveKeys(public, secret, server)


class CurveError(ValueError):
    """Key files missing or unreadable; the message names the file and how to make it."""


def _load(path: Path, want_secret: bool) -> tuple[bytes, bytes | None]:
    hint = f"make the key files with `rankwatch keys --dir {path.parent}`"
    if not path.is_file():
        raise CurveError(f"CurveZMQ key file {path} does not exist; {hint}")
    try:
        import zmq.auth

        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveError(f"cannot read CurveZMQ key file {path}: {exc}") from None
    if want_secret and not secret:
        raise CurveError(f"{path} holds no secret key; {hint}")
    return public, secret


def server_keys(directory: Path) -> tuple[bytes, bytes]:
    """(public, secret) of the aggregator."""
    public, secret = _load(Path(directory) / SERVER_SECRET, want_secret=True)
    assert secret is not None
    return public, secret


def client_keys(directory: Path) -> set[bytes]:
    """Public keys (Z85) of the allowed clients."""
    keys = set()
    for path in sorted(Path(directory).glob(CLIENT_PUBLIC_GLOB)):
        keys.add(_load(path, want_secret=False)[0])
    return keys


class CurveGate:
    """The server side: keys for the ROUTER and a ZAP handler that allows the client keys.

    The ZAP handler is per ZeroMQ context, so the receiver gives it a context of its own.
    """

    def __init__(self, context: zmq.Context[Any], directory: Path | str) -> None:
        if not zmq.has("curve"):
            raise CurveError("this libzmq was built without CURVE support")
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise CurveError(f"CurveZMQ key directory {self.directory} does not exist")
        self.public, self.secret = server_keys(self.directory)
        self._allowed = client_keys(self.directory)
        if not self._allowed:
            raise CurveError(
                f"no client public key ({CLIENT_PUBLIC_GLOB}) in {self.directory}; "
                f"make one with `rankwatch keys --dir {self.directory}`"
            )
        self._lock = threading.Lock()
        self._rescanned = 0.0
        self._logged: set[bytes] = set()
        self.allowed = 0  # handshakes whose client key was allowed
        self.denied = 0  # ... and refused
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(context, log=logging.getLogger("rankwatch.zap"))

    @property
    def clients(self) -> int:
        return len(self._allowed)

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=self)

    def configure(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` (before bind) a CURVE server with the aggregator's keys."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def callback(self, domain: str, key: bytes) -> bool:
        """zmq.auth's credentials provider: is this client key (Z85) allowed?"""
        with self._lock:
            ok = key in self._allowed
            now = time.monotonic()
            if not ok and now - self._rescanned >= RESCAN_MIN_S:
                self._rescanned = now
                try:
                    self._allowed = client_keys(self.directory) or self._allowed
                except CurveError as exc:
                    log.warning("rankwatch: cannot re-read the allowed client keys: %s", exc)
                ok = key in self._allowed
            if ok:
                self.allowed += 1
                return True
            self.denied += 1
            if key not in self._logged and len(self._logged) < MAX_LOGGED_KEYS:
                self._logged.add(key)
                log.warning(
                    "rankwatch: refused an agent with unknown CurveZMQ key %s (allowed: the "
                    "client*.key files in %s)",
                    key.decode("ascii", "replace"),
                    self.directory,
                )
            return False

    def stop(self) -> None:
        self._auth.stop()


class ServerContext:
    """The ZeroMQ context a listening socket (receiver, relay) lives in, with its CurveZMQ gate
    when ``curve_dir`` is given. The ZAP handler belongs to a context, so a gated socket with no
    context handed in gets one of its own, kept apart from other listeners in the process."""

    def __init__(self, context: zmq.Context[Any] | None, curve_dir: Path | str | None) -> None:
        self._own: zmq.Context[Any] | None = None
        if curve_dir is not None and context is None:
            context = self._own = zmq.Context()
        self.context = context or zmq.Context.instance()
        self.gate: CurveGate | None = None
        if curve_dir is not None:
            try:
                self.gate = CurveGate(self.context, curve_dir)
            except Exception:
                self.close()
                raise
            self.gate.start()

    def configure(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` (before bind) a CURVE server, if there is a gate."""
        if self.gate is not None:
            self.gate.configure(sock)

    def close(self) -> None:
        """Stop the gate and end a context of our own (it waits for its sockets' linger)."""
        if self.gate is not None:
            self.gate.stop()
        if self._own is not None:
            self._own.term()
            self._own = None


def client_keys_of(directory: Path | str) -> CurveKeys:
    """The keys an agent holds in ``directory``: ``server.key`` and one ``client*.key_secret``
    (``client.key_secret`` first); ``CurveError`` names what is missing."""
    try:
        return curve_keys(directory)
    except ValueError as exc:
        raise CurveError(str(exc)) from None


def configure_client(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``sock`` (before connect) a CURVE client of the aggregator."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server


def read_monitor(
    monitor: zmq.Socket[Any], counts: dict[str, int], refused_by: dict[str, int]
) -> None:
    """Count what a listening socket's monitor (``get_monitor_socket(MONITOR_EVENTS)``) holds:
    ``connections``, ``disconnects``, ``handshake_incomplete`` and ``refused`` in ``counts``,
    refusals by kind (``HANDSHAKE_FAILED``) in ``refused_by``. Returns when it is empty."""
    from zmq.utils.monitor import parse_monitor_message

    while True:
        try:
            msg = monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        parsed = parse_monitor_message(msg)
        event = parsed["event"]
        if event == zmq.EVENT_ACCEPTED:
            counts["connections"] += 1
        elif event == zmq.EVENT_DISCONNECTED:
            counts["disconnects"] += 1
        elif (
            event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            and parsed["value"] in HANDSHAKE_INCOMPLETE_ERRNOS
        ):
            counts["handshake_incomplete"] += 1
        elif event in HANDSHAKE_FAILED:
            kind = HANDSHAKE_FAILED[event]
            counts["refused"] += 1
            refused_by[kind] = refused_by.get(kind, 0) + 1
