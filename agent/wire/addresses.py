"""Aggregator endpoints: the default ports, the launcher's head address, and parsing.

Accepted forms: ``host``, ``host:port``, ``tcp://host:port``, ``[::1]:port``, ``ipc://path``;
a missing port is ``DEFAULT_INGEST_PORT``. Bad values raise ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

DEFAULT_INGEST_PORT = 8671  # the aggregator's ROUTER port
DEFAULT_HTTP_PORT = 8670  # the dashboard and its API
HEAD_VARS = (("MS_SCHED_HOST", "MS_SCHED_PORT"), ("MASTER_ADDR", "MASTER_PORT"))

_HOST = re.compile(r"^[A-Za-z0-9_.-]+$")


def head_address(env: Mapping[str, str]) -> str | None:
    """The launcher's head node as ``host:port`` (port may be empty), or None."""
    for host_var, port_var in HEAD_VARS:
        host = env.get(host_var, "").strip()
        if host:
            return f"{host}:{env.get(port_var, '').strip()}"
    return None


def parse_addr(value: str) -> str:
    """An aggregator address as a ZeroMQ endpoint; ``ValueError`` says what is wrong."""
    raw = value.strip() if isinstance(value, str) else value
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"aggregator address must be a non-empty string, got {value!r}")
    if raw.startswith("ipc://"):
        if len(raw) == len("ipc://"):
            raise ValueError(f"aggregator address {value!r} has no path")
        return raw
    rest = raw[len("tcp://") :] if raw.startswith("tcp://") else raw
    if "://" in rest:
        raise ValueError(f"aggregator address {value!r}: only tcp:// and ipc:// are supported")
    port_text = ""
    if rest.startswith("["):  # [v6]:port or [v6]
        end = rest.find("]")
        if end < 0:
            raise ValueError(f"aggregator address {value!r} has an unclosed '['")
        host, tail = rest[1:end], rest[end + 1 :]
        if tail and not tail.startswith(":"):
            raise ValueError(f"aggregator address {value!r}: expected ':port' after ']'")
        port_text = tail[1:]
        if not host or not all(c in "0123456789abcdefABCDEF:." for c in host):
            raise ValueError(f"aggregator address {value!r} has a bad IPv6 address")
        host = f"[{host}]"
    elif rest.count(":") > 1:
        raise ValueError(f"aggregator address {value!r}: write an IPv6 address as [addr]:port")
    else:
        host, _, port_text = rest.partition(":")
        if rest.endswith(":"):
            raise ValueError(f"aggregator address {value!r} has an empty port")
        if not host or not _HOST.match(host):
            raise ValueError(f"aggregator address {value!r} has a bad host name {host!r}")
    port = DEFAULT_INGEST_PORT
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"aggregator address {value!r} has a bad port {port_text!r}")
        port = int(port_text)
    return f"tcp://{host}:{port}"


def resolve_addr(addr: str | None, env: Mapping[str, str]) -> str | None:
    if addr is not None:
        return parse_addr(addr)
    if env.get("RANKWATCH_ADDR", "").strip():
        try:
            return parse_addr(env["RANKWATCH_ADDR"])
        except ValueError as exc:
            raise ValueError(f"RANKWATCH_ADDR: {exc}") from None
    for host_var, _ in HEAD_VARS:
        host = env.get(host_var, "").strip()
        if host:
            bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
            try:
                return parse_addr(bracketed)
            except ValueError as exc:
                raise ValueError(f"{host_var}: {exc}") from None
    return None
