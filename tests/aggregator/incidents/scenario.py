"""Deliver a fault's evidence to a tracker the way the service would: in passes, maybe shuffled."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rankwatch.aggregator.incidents.model import IncidentChange
from rankwatch.aggregator.incidents.tracker import IncidentTracker

from tests.aggregator.incidents.builders import T0, health

Item = tuple[str, Any]  # ("health" | "divergences" | "resolved" | "stacks" | "alerts", value)


def world(n: int, *, step: int = 19, run: str = "job") -> list[Item]:
    """Every rank seen alive (the first health transitions of a run)."""
    return [("health", health(r, world=n, step=step, run=run)) for r in range(n)]


def deliver(
    tracker: IncidentTracker,
    items: Sequence[Item],
    *,
    seed: int | None = None,
    passes: int = 1,
    now: float = T0 + 100,
    times: dict[tuple[str, int, int], float] | None = None,
) -> list[IncidentChange]:
    """``items`` in ``passes`` observe calls; shuffled first when ``seed`` is given."""
    items = list(items)
    if seed is not None:
        random.Random(seed).shuffle(items)
    size = max(1, -(-len(items) // passes))
    changes: list[IncidentChange] = []
    for i in range(0, len(items), size):
        kw: dict[str, list[Any]] = {}
        for kind, value in items[i : i + size]:
            kw.setdefault(kind, []).append(value)
        changes += tracker.observe(now + i / size, times=times, **kw)
    return changes
