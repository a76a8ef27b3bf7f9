"""Incidents on their way out of the tick: stored (each announced change, and an open incident
again when it grows quietly), on the live stream, told to the sinks that take incidents; which
alert transitions they stand for (webhooks leave those to them); and read back for the API.

``judge`` runs under the service's lock (it reads the tracker), ``announce`` after it. A new
incident's first message waits for its evidence to settle (``hold.py``); storing and streaming
do not wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.base import Sink
from rankwatch.aggregator.alerts.sinks.fanout import deliver
from rankwatch.aggregator.feed import Feed, jsonable
from rankwatch.aggregator.health import RankHealth
from rankwatch.aggregator.hold import AnnounceHold
from rankwatch.aggregator.incidents import IncidentChange, IncidentTracker
from rankwatch.aggregator.incidents.cover import AlertCover
from rankwatch.aggregator.incidents.keep import StoreDue
from rankwatch.aggregator.incidents.model import evidence_dict
from rankwatch.aggregator.snapshot import incident_body
from rankwatch.aggregator.store.db import Store, StoreError

log = logging.getLogger("rankwatch.service")

Health = Mapping[str, Mapping[int, RankHealth]]

__all__ = ["IncidentOutlet", "stored_number"]


class IncidentOutlet:
    def __init__(
        self,
        tracker: IncidentTracker,
        store: Store,
        feed: Feed,
        note: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: body,
    ) -> None:
        self.tracker = tracker
        self.note = note  # what the announced changes were given (the culprits' card notes)
        self.store = store
        self.feed = feed
        self.cover = AlertCover()  # the alerts webhooks leave to the incidents' messages
        self.due = StoreDue()  # open incidents that grew since the store last got them
        cfg = tracker.config
        self.hold = AnnounceHold(cfg.announce_quiet_s, cfg.announce_hold_s)

    def judge(
        self,
        changes: Sequence[IncidentChange],
        alerts: Sequence[Alert],
        touched: set[str],
        health: Health,
    ) -> tuple[list[dict[str, Any]], list[bool]]:
        """Under the lock: the changes' bodies (with hosts), per alert whether an incident
        stands for it; and the open incidents of the ``touched`` runs that grew, stored."""
        bodies = [incident_body(c.incident, health.get(c.incident.run, {})) for c in changes]
        runs = {a.run: self.tracker.incidents(a.run) for a in alerts}
        covered = self.cover.judge(alerts, runs.items())
        for change in changes:
            self.due.stored(change.incident)
        for run in touched | runs.keys():
            for inc in self.due.due(self.tracker.incidents(run)):
                self._store(self.note(incident_body(inc, health.get(run, {}))))
        return bodies, covered

    def announce(
        self,
        changes: Sequence[IncidentChange],
        bodies: Sequence[dict[str, Any]],
        sinks: list[Sink],
        now: float,
    ) -> int:
        """Each change stored and streamed; delivered to the sinks once due (``hold.py``; call
        it every pass, with or without changes). Returns how many sinks failed."""
        failed = 0
        for change, body in zip(changes, bodies, strict=True):
            self._store(body)
            self.feed.publish(
                {"type": "incident", "run": body["run"], "change": change.change, "incident": body}
            )
        for change in self.hold.due(now, changes):
            failed += deliver(sinks, change)
        return failed

    def tell(self, changes: Sequence[IncidentChange], sinks: list[Sink], now: float) -> int:
        """Changes that are only told (how an incident's commands ended): after its held first
        message, never before it. Returns how many sinks failed."""
        return sum(deliver(sinks, change) for change in self.hold.due(now, changes))

    def release(self, sinks: list[Sink]) -> int:
        """Deliver what is held now (the service is stopping); how many sinks failed."""
        return sum(deliver(sinks, change) for change in self.hold.flush())

    def _store(self, body: dict[str, Any]) -> None:
        try:
            self.store.append_incident(body)
        except StoreError as exc:  # only when closed: the process is stopping
            log.error("rankwatch: incident not stored: %s", exc)

    def read(self, run: str, live: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every incident of ``run``, newest first: ``live`` (the tracker's, as dicts) over
        those only the store still holds (an earlier `serve`, a run retired from the live
        state). The tracker's values have no hosts: the stored judgement's stay."""
        stored = {inc["id"]: _as_now(inc) for inc in self.store.incidents(run)}
        merged = {**stored, **{inc["id"]: {**stored.get(inc["id"], {}), **inc} for inc in live}}
        return sorted(merged.values(), key=lambda i: (i.get("opened", 0.0), i["id"]), reverse=True)


def _as_now(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored incident in today's shape: one stored before timeline items had groups reads
    as one item per rank."""
    timeline = stored.get("timeline")
    if isinstance(timeline, list):
        stored["timeline"] = [evidence_dict(e) if isinstance(e, dict) else e for e in timeline]
    return stored


def stored_number(store: Store, run: str) -> int:
    """The highest number among ``run``'s stored incident ids (``run#N``); 0 with none, or
    with a store that cannot be read (the process is stopping)."""
    try:
        ids = [str(inc.get("id", "")) for inc in store.incidents(run)]
    except StoreError:
        return 0
    numbers = [tail for i in ids if (tail := i.rpartition("#")[2]).isdigit()]
    return max(map(int, numbers), default=0)


def live_dicts(tracker: IncidentTracker, run: str) -> list[dict[str, Any]]:
    return [jsonable(inc.as_dict()) for inc in tracker.incidents(run)]
