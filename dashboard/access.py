"""Who may talk to the dashboard: the Host it is reached by, the page a request comes from, the
body type a write carries, and whether HTTP ingest is on at all.

A token (``auth.py``) says who; this says from where. Without it, any web page the operator
opens could post records (a cross-site ``text/plain`` POST needs no CORS preflight) and a DNS
rebinding page, served under a name that resolves to this server, could read every run.

* **Host**: the name in the request must be one this server answers to: an IP address (a
  rebinding page always uses a name), ``localhost``, the bound address, this machine's host
  name, or a name allowed with ``serve --allow-host`` (``allow_hosts`` in the config file;
  ``*`` turns the check off, for a reverse proxy that checks names itself).
* **Origin**: a request a browser sends from another page (its ``Origin`` is not this server,
  or ``Sec-Fetch-Site`` says cross-site) is refused on the API and on every write.
* **Content type**: a write (POST, PUT, PATCH, DELETE) must be ``application/json``.
* **HTTP ingest** may be off (``serve --curve`` without a token: the records must then come
  through the CurveZMQ port, which checks each agent's key).

``/healthz`` stays open: liveness probes come by IP or a cluster name and learn nothing.
``decide`` is the pure rule; ``AccessGuard`` is the ASGI middleware around it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPES = ("application/json",)
INGEST_PATH = "/api/ingest"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
# What a refusal is counted as (``http_refused`` on /metrics)
REASONS = ("host", "origin", "content_type", "ingest_off")


@dataclasses.dataclass(frozen=True)
class Access:
    """The policy. ``hosts``: names besides IP addresses and localhost (lower case);
    ``any_host``: no Host check; ``ingest_off``: why HTTP ingest is refused (None: it is on)."""

    hosts: frozenset[str] = frozenset()
    any_host: bool = False
    ingest_off: str | None = None

    @classmethod
    def for_server(
        cls,
        bound: str,
        names: Iterable[str] = (),
        allowed: Iterable[str] = (),
        ingest_off: str | None = None,
    ) -> Access:
        """``bound``: the address the dashboard listens on; ``names``: this machine's names
        (the banner prints one); ``allowed``: ``--allow-host`` values."""
        allowed = [a.strip().lower() for a in allowed if a.strip()]
        hosts = {n.lower() for n in (*names, *allowed) if n and n != "*"}
        if bound not in ("", "0.0.0.0", "::"):
            hosts.add(bound.lower().strip("[]"))
        return cls(frozenset(hosts), "*" in allowed, ingest_off)


@dataclasses.dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # one of REASONS
    message: str


def host_name(host_header: str) -> str:
    """``example.org:8670`` -> ``example.org``; ``[::1]:8670`` -> ``::1``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def host_allowed(name: str, access: Access) -> bool:
    if access.any_host or name in LOOPBACK_NAMES or name in access.hosts:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def decide(method: str, path: str, headers: Mapping[str, str], access: Access) -> Refusal | None:
    """Why this request is refused, or None. ``headers``: lower-case names."""
    if path in OPEN_PATHS:
        return None
    host = headers.get("host", "")
    name = host_name(host)
    if not host_allowed(name, access):
        return Refusal(
            403,
            "host",
            f"this rankwatch server does not answer to the name {name!r} (Host header): "
            f"if that is how you reach it, start it with `rankwatch serve --allow-host {name}` "
            "(or allow_hosts in the [serve] config); a page that reaches it by a foreign name "
            "may be a DNS rebinding attack",
        )
    write = method in WRITE_METHODS
    api = path == "/api" or path.startswith("/api/") or path == "/openapi.json"
    origin = headers.get("origin")
    if write or api:
        foreign = origin is not None and not _same_origin(origin, host, access)
        if foreign or (origin is None and headers.get("sec-fetch-site") == "cross-site"):
            shown = origin if origin is not None else "another site (Sec-Fetch-Site)"
            return Refusal(
                403,
                "origin",
                f"cross-site request refused: it comes from {shown}, not from this server's "
                f"own page ({host}); the dashboard's API and writes answer only its own page "
                "and scripts (which send no Origin)",
            )
    if write:
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype not in JSON_TYPES:
            got = f"{ctype!r}" if ctype else "none"
            return Refusal(
                415,
                "content_type",
                f"{method} {path} takes Content-Type: application/json (got {got})",
            )
        if path == INGEST_PATH and access.ingest_off is not None:
            return Refusal(403, "ingest_off", access.ingest_off)
    return None


def _same_origin(origin: str, host: str, access: Access) -> bool:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False  # "null" (a sandboxed frame, a file:// page) and anything odd
    if parts.netloc.lower() == host.strip().lower():
        return True
    return (parts.hostname or "") in access.hosts  # a name allowed by the operator (a proxy's)


class AccessCounts:
    """Requests refused, by reason; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def counters(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"http_refused": dict(self.refused)}


class AccessGuard:
    """Answers a refused request itself (JSON ``{"detail": ...}``); passes the others on."""

    def __init__(self, app: ASGIApp, access: Access, counts: AccessCounts) -> None:
        self.app = app
        self.access = access
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = decide(scope["method"], scope["path"], headers, self.access)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        self.counts.add(refusal.reason)
        body = json.dumps({"detail": refusal.message}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": refusal.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
