"""The source protocol, the telemetry setting, the built-in table and the registry (no threads,
no I/O: the built-in sources touch nothing until their first ``sample``)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..values import check_name
from ..wire.records import MAX_SOURCE_CHARS

SOURCES_ENV = "RANKWATCH_SOURCES"  # comma-separated built-in source names (added to telemetry)
TELEMETRY_ENV = "RANKWATCH_TELEMETRY"  # "off" | "on" | source names | an interval, comma-separated
CKPT_DIR_ENV = "RANKWATCH_CKPT_DIR"  # the folder the host source reports the free disk of
INTERVAL_S = 10.0  # telemetry interval unless the setting names one
MIN_INTERVAL_S = 0.05
NPU_MIN_INTERVAL_S = 10.0  # npu-smi is slow (hundreds of ms a call): never polled faster
ALIASES = {"process": "host"}  # the former process source is part of host now


class SourceError(RuntimeError):
    """A source that cannot go on (no tool, no driver, output it cannot read): its message is
    the whole story, logged once as it is."""


@dataclass(frozen=True, slots=True)
class Reading:
    """A sample with more than values: what ``sample`` may return instead of a plain map.

    ``device`` is ``""`` for host-wide values, else e.g. ``"npu:3"`` / ``"gpu:0"``; ``labels``
    are short text facts (``{"health": "Warning"}``). Keys are the source's own; the monitor
    prefixes them with ``<source>/``.
    """

    values: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    device: str = ""


@runtime_checkable
class Source(Protocol):
    """Something the sampler thread polls every ``interval_s`` seconds.

    ``sample(now)`` returns values by key, or a ``Reading`` (``now``: Unix seconds of this
    poll). It runs on the sampler thread, never the training thread; raising stops the source.
    """

    name: str
    interval_s: float

    def sample(self, now: float) -> Mapping[str, Any] | Reading: ...


@dataclass(frozen=True, slots=True)
class Context:
    """What built-in sources may need to know about their rank (resolved by the monitor)."""

    log_dir: Path
    ckpt_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def _host(interval_s: float, ctx: Context) -> Source:
    from .host import HostSource

    return HostSource(interval_s, log_dir=ctx.log_dir, ckpt_dir=ctx.ckpt_dir)


def _npu(interval_s: float, ctx: Context) -> Source:
    from .npu import NpuSource

    return NpuSource(max(interval_s, NPU_MIN_INTERVAL_S), env=ctx.env)


def _gpu(interval_s: float, ctx: Context) -> Source:
    from .gpu import GpuSource

    return GpuSource(interval_s, env=ctx.env)


def _memory(interval_s: float, ctx: Context) -> Source:
    from .memory import MemorySource

    return MemorySource(interval_s, env=ctx.env)


# Built-in sources by name: factory(interval_s, context). Their modules load only when named.
BUILTIN: dict[str, Callable[[float, Context], Source]] = {
    "host": _host, "npu": _npu, "gpu": _gpu, "memory": _memory,
}  # fmt: skip


def detected() -> list[str]:
    """The built-in sources ``"on"`` starts: host, memory, and npu / gpu where their tool or
    library is installed (a card they then cannot read is said once, and the source stops)."""
    names = ["host"]
    if shutil.which("npu-smi") is not None:
        names.append("npu")
    if importlib.util.find_spec("pynvml") is not None and Path("/proc/driver/nvidia").exists():
        names.append("gpu")
    names.append("memory")  # reports only once a framework with device memory is in use
    return names


@dataclass(frozen=True, slots=True)
class Telemetry:
    """A parsed telemetry setting: which built-in sources (None: ``detected()``), how often."""

    names: tuple[str, ...] | None
    interval_s: float = INTERVAL_S
    enabled: bool = True


OFF = Telemetry((), INTERVAL_S, enabled=False)
_INTERVAL = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?$")


def parse_telemetry(setting: str | float | bool | None) -> Telemetry:
    """``Monitor(telemetry=...)`` / ``RANKWATCH_TELEMETRY``: ``"off"``, ``"on"`` (the default:
    ``detected()`` sources), source names (``"host,npu"``), an interval (``"30s"``, ``"500ms"``,
    ``"2m"`` or seconds as a number), or names and an interval together (``"host,5s"``).
    ``ValueError`` says what is wrong with anything else."""
    if setting is None or setting is True:
        return Telemetry(None)
    if setting is False:
        return OFF
    if isinstance(setting, (int, float)):
        return Telemetry(None, _check_interval(float(setting), setting))
    if not isinstance(setting, str):
        raise ValueError(f"telemetry must be 'on', 'off', source names or seconds: {setting!r}")
    names: list[str] = []
    interval = INTERVAL_S
    parts = [p.strip().lower() for p in setting.split(",") if p.strip()]
    if not parts or parts == ["on"]:
        return Telemetry(None)
    if parts in (["off"], ["0"], ["false"], ["no"]):
        return OFF
    auto = False
    for part in parts:
        found = _INTERVAL.match(part)
        if found is not None:
            scale = {"ms": 1e-3, "m": 60.0}.get(found.group(2) or "s", 1.0)
            interval = _check_interval(float(found.group(1)) * scale, part)
        elif part == "on":
            auto = True
        elif part in BUILTIN or part in ALIASES:
            names.append(ALIASES.get(part, part))
        else:
            known = ", ".join([*BUILTIN, "on", "off"])
            raise ValueError(
                f"telemetry setting {setting!r}: {part!r} is neither a source ({known}) nor an "
                "interval such as '10s'"
            )
    if auto or not names:
        return Telemetry(None, interval)
    return Telemetry(tuple(dict.fromkeys(names)), interval)


def _check_interval(seconds: float, given: Any) -> float:
    if not MIN_INTERVAL_S <= seconds < math.inf:
        raise ValueError(f"telemetry interval {given!r} must be at least {MIN_INTERVAL_S} s")
    return seconds


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
        if not reason and len(name) > MAX_SOURCE_CHARS:
            reason = f"{len(name)} chars, max {MAX_SOURCE_CHARS}"
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

    def names(self) -> list[str]:
        return list(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


def resolve(
    sources: Iterable[Source | str] | None,
    env: str | None = None,
    telemetry: Telemetry = OFF,
    context: Context | None = None,
) -> SourceRegistry:
    """A registry of ``sources`` (instances or built-in names), those named in ``env``
    (``RANKWATCH_SOURCES`` when None) and the built-in ones ``telemetry`` asks for."""
    registry = SourceRegistry()
    ctx = context or Context(Path.cwd())
    wanted: list[Source | str] = list(sources or ())
    env = os.environ.get(SOURCES_ENV) if env is None else env
    wanted += [n.strip() for n in (env or "").split(",") if n.strip()]
    if telemetry.enabled:
        wanted += list(detected() if telemetry.names is None else telemetry.names)
    seen: set[str] = set()
    for item in wanted:
        if isinstance(item, str):
            name = ALIASES.get(item, item)
            if name in seen:
                continue  # named twice (argument, environment, telemetry)
            factory = BUILTIN.get(name)
            if factory is None:
                known = ", ".join(sorted(BUILTIN))
                raise ValueError(f"unknown metric source {item!r} (built-in: {known})")
            item = factory(telemetry.interval_s, ctx)
        registry.register(item)
        seen.add(item.name)
    return registry
