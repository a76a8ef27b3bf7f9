"""rankwatch.agent: the per-rank agent. Needs only pyzmq and msgpack.

``from rankwatch.agent import Monitor``; framework helpers live in ``rankwatch.agent.torch``
and ``rankwatch.agent.mindspore`` and are never imported from here.
"""

from .monitor import Monitor
from .wire.addresses import DEFAULT_INGEST_PORT

__all__ = ["DEFAULT_INGEST_PORT", "Monitor"]
