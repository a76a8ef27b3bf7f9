"""Whether a TCP port is taken, asked before a command creates anything."""

from __future__ import annotations

import errno
import socket

ANY_HOSTS = ("*", "")  # ZeroMQ's and the empty spelling of "every interface"


def in_use(host: str, port: int) -> bool:
    """True when binding ``host:port`` fails because another socket holds it. Port 0, a name
    that does not resolve and an address this machine lacks are left for the real bind to
    report (it names them)."""
    if port == 0:
        return False
    host = "0.0.0.0" if host in ANY_HOSTS else host.strip("[]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError):
        return False
    with socket.socket(family, kind, proto) as sock:
        # What uvicorn and ZeroMQ set: a port in TIME_WAIT is free to them, so it is here.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def busy_message(scheme: str, host: str, port: int, flag: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port} is in use (another rankwatch serve?): pick another {flag}"
