"""Handing alert and incident transitions to every sink: one broken sink costs a count and a
log line, never the other sinks or ingest."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.base import Sink
from rankwatch.aggregator.incidents.model import IncidentChange

log = logging.getLogger("rankwatch.service")


def deliver(sinks: Sequence[Sink], item: Alert | IncidentChange) -> int:
    """``item`` to every sink that takes it (incidents: sinks with ``submit_incident``);
    returns how many sinks failed."""
    failed = 0
    for sink in sinks:
        if isinstance(item, IncidentChange):
            submit = getattr(sink, "submit_incident", None)
            if submit is None:
                continue
        else:
            submit = sink.submit
        try:
            submit(item)
        except Exception:  # one broken sink must not stop the others or ingest
            failed += 1
            log.exception("rankwatch: alert sink %s failed", sink.name)
    return failed
