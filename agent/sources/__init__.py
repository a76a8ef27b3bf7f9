"""Agent-side telemetry sources: each one file, registered, sampled off the training thread.

In the spirit of prometheus/client_python's ``Collector`` and ``CollectorRegistry.register()``:
a source has a ``name``, an ``interval_s`` and ``sample(now) -> {key: number}`` (or a
``Reading`` with a device and labels); a ``SourceRegistry`` holds the sources of one
``Monitor``, and a ``Sampler`` thread polls them.

The training loop is the first source. Its values come in through ``Monitor.log()`` on the
training thread itself, so it is not polled and not listed here. Every other source is polled
by the sampler thread; each sample goes out as a *telemetry record* (``wire.records``: its own
seq, the time it was taken, ``<source>/<key>`` values), written to the JSONL and sent in frames
of its own, whether or not the rank steps.

Built-in sources (``BUILTIN``): ``host`` (psutil: CPU, memory, load, disk, network), ``npu``
(``npu-smi``), ``gpu`` (NVML through ``pynvml``, the ``gpu`` extra) and ``memory`` (the
framework's device-memory counters). ``Monitor(telemetry=...)`` / ``RANKWATCH_TELEMETRY`` says
which run and how often (``parse_telemetry``; default ``"on"``: host, memory, and npu / gpu
where present, every 10 s). A source that raises is said once in the rank's log and stopped;
nothing reaches the training thread. A new built-in source is one module here plus its line in
``BUILTIN``.
"""

from __future__ import annotations

from .base import (
    BUILTIN,
    CKPT_DIR_ENV,
    SOURCES_ENV,
    TELEMETRY_ENV,
    Context,
    Reading,
    Source,
    SourceError,
    SourceRegistry,
    Telemetry,
    detected,
    parse_telemetry,
    resolve,
)
from .sampler import Sampler

__all__ = [
    "BUILTIN", "CKPT_DIR_ENV", "SOURCES_ENV", "TELEMETRY_ENV", "Context", "Reading", "Sampler",
    "Source", "SourceError", "SourceRegistry", "Telemetry", "detected", "parse_telemetry",
    "resolve",
]  # fmt: skip
