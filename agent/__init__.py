"""rankwatch.agent: the per-rank agent. Needs only pyzmq and msgpack.

``from rankwatch.agent import Monitor``; framework helpers live in ``rankwatch.agent.torch``
and ``rankwatch.agent.mindspore`` and are never imported from here.

``Monitor`` is imported on first use: the head node and the relay import ``rankwatch.agent.wire``,
and that must not load the Monitor, its sender thread code or its process hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .wire.addresses import DEFAULT_INGEST_PORT

if TYPE_CHECKING:
    from .monitor import Monitor

__all__ = ["DEFAULT_INGEST_PORT", "Monitor"]


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from .monitor import Monitor

        return Monitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
