"""The sampler thread: polls each registered source at its interval, off the training thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .base import Reading, SourceError, SourceRegistry

log = logging.getLogger("rankwatch.agent")

# (source name, sample, Unix time the sample was taken) -> None
Emit = Callable[[str, Mapping[str, Any] | Reading, float], None]


class Sampler:
    """Calls ``emit(name, sample, time)`` with each sample; a source that raises is said once and
    dropped from the registry, and the thread ends when no source is left or on ``close``."""

    def __init__(self, registry: SourceRegistry, emit: Emit) -> None:
        self.registry = registry
        self._emit = emit
        self._stop = threading.Event()
        self._unrecorded: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="rankwatch-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float) -> bool:
        """Stop polling; True when the thread ended in time (a slow ``sample`` may outlast it)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        due: dict[str, float] = {}  # source name -> monotonic time of its next poll
        while not self._stop.is_set():
            sources = self.registry.sources()
            if not sources:
                return
            for source in sources:
                at = time.monotonic()
                if due.setdefault(source.name, at) <= at:
                    due[source.name] = at + source.interval_s
                    self._poll(source.name, source.sample)
            wait = min(due[s.name] for s in self.registry.sources() or sources)
            self._stop.wait(max(0.0, wait - time.monotonic()))

    def _poll(self, name: str, sample: Callable[[float], Mapping[str, Any] | Reading]) -> None:
        at = time.time()
        try:
            values = sample(at)
            if not isinstance(values, (Mapping, Reading)):
                raise TypeError(f"sample() returned {type(values).__name__}, not a mapping")
        except Exception as exc:  # the source's own bug or a missing file: never training's
            log.warning("rankwatch: metric source %r failed and was stopped: %s", name, _why(exc))
            self.registry.unregister(name)
            return
        try:
            self._emit(name, values, at)
        except Exception as exc:  # a bug of ours: keep the other sources going
            if name not in self._unrecorded:
                self._unrecorded.add(name)
                log.warning("rankwatch: metric source %r: sample not recorded: %r", name, exc)


def _why(exc: Exception) -> str:
    """The failure in words: a source's own error as its message, anything else as its repr."""
    return str(exc) if isinstance(exc, SourceError) and str(exc) else repr(exc)
