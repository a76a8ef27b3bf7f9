"""The webhook kinds: every module of this package with a ``KIND``, plus any ``register``ed.

Discovery is what makes a new kind one file: drop ``teams.py`` with ``KIND = WebhookKind(...)``
next to ``slack.py`` and the config file and ``--webhook`` know it.
"""

from __future__ import annotations

import importlib
import pkgutil

from rankwatch.aggregator.alerts.sinks.base import WebhookKind, describe

_KINDS: dict[str, WebhookKind] = {}
_ALIASES: dict[str, str] = {}
_discovered = False


def register(kind: WebhookKind) -> WebhookKind:
    """Add ``kind`` (and its aliases); a name already taken by another kind is an error."""
    for name in (kind.name, *kind.aliases):
        owner = _ALIASES.get(name.lower())
        if owner is not None and _KINDS[owner] is not kind:
            raise ValueError(f"webhook kind {name!r} is registered already")
    _KINDS[kind.name.lower()] = kind
    for name in (kind.name, *kind.aliases):
        _ALIASES[name.lower()] = kind.name.lower()
    return kind


def unregister(name: str) -> None:
    kind = _KINDS.pop(name.lower(), None)
    if kind is not None:
        for alias in (kind.name, *kind.aliases):
            _ALIASES.pop(alias.lower(), None)


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    package = importlib.import_module(__package__)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__package__}.{info.name}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, WebhookKind) and kind.name.lower() not in _KINDS:
            register(kind)


def kinds() -> dict[str, WebhookKind]:
    """Every known kind by its canonical name."""
    _discover()
    return dict(_KINDS)


def resolve(name: str) -> WebhookKind:
    """The kind called ``name`` (or one of its aliases, any case); ValueError lists them."""
    _discover()
    canonical = _ALIASES.get(name.lower())
    if canonical is None:
        raise ValueError(f"unknown webhook kind {name!r}; expected one of {describe(_KINDS)}")
    return _KINDS[canonical]
