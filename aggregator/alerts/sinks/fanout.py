"""Handing alert and incident transitions to every sink: one broken sink costs a count and a
log line, never the other sinks or ingest."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.base import Sink
from rankwatch.aggregator.incidents.model import IncidentChange

log = logging.getLogger("rankwatch.service")


def deliver(sinks: Sequence[Sink], item: Alert | IncidentChange, covered: bool = False) -> int:
    """``item`` to every sink that takes it (incidents: sinks with ``submit_incident``);
    returns how many sinks failed. ``covered``: an incident stands for this alert, so sinks
    that take incidents and say ``covered_alerts = False`` (webhooks) do not get it."""
    failed = 0
    for sink in sinks:
        if isinstance(item, IncidentChange):
            submit = getattr(sink, "submit_incident", None)
            if submit is None:
                continue
        else:
            takes = hasattr(sink, "submit_incident")
            if covered and takes and not getattr(sink, "covered_alerts", True):
                continue
            submit = sink.submit
        try:
            submit(item)
        except Exception:  # one broken sink must not stop the others or ingest
            failed += 1
            log.exception("rankwatch: alert sink %s failed", sink.name)
    return failed
