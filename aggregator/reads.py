"""What the provider reads of the aggregator beyond its snapshot (``snapshot.py``): a run's
commands and incidents, the live ones (copied under the lock) merged with the stored ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankwatch.aggregator.actions.desk import annotate
from rankwatch.aggregator.outlet import live_dicts

if TYPE_CHECKING:
    from rankwatch.aggregator.service import Aggregator


def commands_of(agg: Aggregator, run: str) -> list[dict[str, Any]]:
    """Every command of ``run`` with its answers, newest first: live and stored."""
    with agg.lock:
        live = {c["id"]: c for c in agg.actions.commands(run)}
    stored = {c["id"]: c for c in agg.store.commands(run)}
    merged = {**stored, **live}
    return sorted(merged.values(), key=lambda c: (c["created"], c["id"]), reverse=True)


def incidents_of(agg: Aggregator, run: str) -> list[dict[str, Any]]:
    """Every incident of ``run``, newest first, live or stored (``IncidentOutlet.read``)."""
    with agg.lock:
        note = agg.telemetry.annotate_dict
        live = [note(body) for body in live_dicts(agg.incidents, run)]
    merged = {inc["id"]: inc for inc in agg.outlet.read(run, live)}
    annotate(merged, commands_of(agg, run))  # what a policy did about each, and the answers
    return sorted(merged.values(), key=lambda i: (i.get("opened", 0.0), i["id"]), reverse=True)
