"""Agent-side metric sources: each one file, registered, sampled off the training thread.

In the spirit of prometheus/client_python's ``Collector`` and ``CollectorRegistry.register()``:
a source has a ``name``, an ``interval_s`` and ``sample(now) -> {key: number}``; a
``SourceRegistry`` holds the sources of one ``Monitor``, and a ``Sampler`` thread polls them.

The training loop is the first source. Its values come in through ``Monitor.log()`` on the
training thread itself (the hot path formats and queues them without any registry lookup), so it
is not polled and not listed here. Every other source is polled by the sampler thread; its
values go out as an ordinary step record at the rank's last logged step, with metric names
``<source>/<key>``, at most once per source per step (a rank that stops stepping stops sending
them; before the first ``log()`` there is no step to attach them to).

A source that raises is said once and stopped; nothing reaches the training thread. Built-in
sources are off by default: ``Monitor(sources=["process", my_source])`` or
``RANKWATCH_SOURCES=process``. A new built-in source is one module here plus its line in
``BUILTIN``.
"""

from __future__ import annotations

from .base import BUILTIN, SOURCES_ENV, Source, SourceRegistry, resolve
from .sampler import Sampler

__all__ = ["BUILTIN", "SOURCES_ENV", "Sampler", "Source", "SourceRegistry", "resolve"]
