"""The source protocol, the built-in table and the registry (no threads, no I/O)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ..values import check_name
from .process import ProcessSource

SOURCES_ENV = "RANKWATCH_SOURCES"  # comma-separated built-in source names

# Built-in sources by name; each is a class whose no-argument instance is the source.
BUILTIN: dict[str, Callable[[], Source]] = {"process": ProcessSource}


@runtime_checkable
class Source(Protocol):
    """Something the sampler thread polls every ``interval_s`` seconds.

    ``sample(now)`` returns metric values by key (``now``: Unix seconds of this poll). It runs
    on the sampler thread, never the training thread; raising stops the source.
    """

    name: str
    interval_s: float

    def sample(self, now: float) -> Mapping[str, Any]: ...


class SourceRegistry:
    """The sources of one monitor, by name."""

    def __init__(self) -> None:
        self._sources: dict[str, Source] = {}

    def register(self, source: Source) -> None:
        """Add ``source``; ``ValueError`` for a duplicate name or one that makes no sense."""
        name = getattr(source, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"source name {name!r} is not usable: empty name")
        reason = check_name(f"{name}/x")
        if reason or "/" in name:
            raise ValueError(f"source name {name!r} is not usable: {reason or 'contains /'}")
        interval = getattr(source, "interval_s", None)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise ValueError(f"source {name!r}: interval_s must be seconds, got {interval!r}")
        if not 0 < interval < math.inf:
            raise ValueError(f"source {name!r}: interval_s must be > 0, got {interval!r}")
        if not callable(getattr(source, "sample", None)):
            raise ValueError(f"source {name!r} has no sample(now) method")
        if name in self._sources:
            raise ValueError(f"source {name!r} is registered twice")
        self._sources[name] = source

    def unregister(self, name: str) -> None:
        self._sources.pop(name, None)

    def sources(self) -> list[Source]:
        return list(self._sources.values())

    def __len__(self) -> int:
        return len(self._sources)


def resolve(sources: Iterable[Source | str] | None, env: str | None = None) -> SourceRegistry:
    """A registry of ``sources`` (instances or built-in names) plus those named in ``env``."""
    registry = SourceRegistry()
    wanted: list[Source | str] = list(sources or ())
    env = os.environ.get(SOURCES_ENV) if env is None else env
    wanted += [n.strip() for n in (env or "").split(",") if n.strip()]
    seen: set[str] = set()
    for item in wanted:
        if isinstance(item, str):
            if item in seen:
                continue  # named by both the argument and the environment
            factory = BUILTIN.get(item)
            if factory is None:
                known = ", ".join(sorted(BUILTIN))
                raise ValueError(f"unknown metric source {item!r} (built-in: {known})")
            item = factory()
        registry.register(item)
        seen.add(item.name)
    return registry
