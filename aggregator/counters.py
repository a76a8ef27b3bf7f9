"""The aggregator's counters as one flat-ish dict (Prometheus takes one level of nesting as a
label): records, ingest, incidents, stacks, merge, feed, store, webhooks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rankwatch.aggregator.settings import INGEST_COUNTERS, RECORD_COUNTERS

if TYPE_CHECKING:
    from rankwatch.aggregator.service import Aggregator


def service_counters(agg: Aggregator) -> dict[str, Any]:
    rx = agg.receiver.counters() if agg.receiver is not None else {}
    n = dict(agg.n)
    out: dict[str, Any] = {f"records_{k}": n.pop(k) for k in RECORD_COUNTERS}
    out.update({f"ingest_{k}": rx.get(k, 0) for k in INGEST_COUNTERS})
    out.update(n)  # resend_requests, sink_errors, internal_errors, ...
    out.update(
        ingest_errors=rx.get("reasons", {}),
        ingest_refused_by=rx.get("refused_by", {}),
        control_sent=rx.get("control_sent", 0),
        control_failed=rx.get("control_failed", 0),
        behind_episodes=agg.progress.episodes,  # ingest fell behind: rank silence not judged
        behind_seconds=agg.progress.behind(time.time()) if agg.receiver is not None else 0.0,
        behind_max_seconds=agg.progress.worst_s,
        rank_restarts=agg.restarts.restarts,  # new incarnations of known ranks
        incidents_evicted=agg.incidents.evicted,
        incidents_dropped_evidence=agg.incidents.dropped_evidence,
        incidents_refused_stacks=agg.incidents.refused_stacks,
        **agg.actions.counters(),  # commands issued, sent, answered, refused, unanswered
        **agg.stacks.counters(),  # stack samples from heartbeats: received, refused, ...
        health_sweeps=agg.healthview.sweeps,  # every rank evaluated again (healthview.py)
        health_sweep_seconds=round(agg.healthview.last_sweep_s, 4),
        merge_late=agg.merger.late,
        merge_evicted=agg.merger.evicted,
        feed_published=agg.feed.published,
        feed_dropped=agg.feed.dropped,
        feed_subscribers=agg.feed.subscribers,
        store_errors=agg.flusher.errors,
        store_failing=int(agg.flusher.error is not None),
        **agg.store.counters(),  # records set aside, band settles that failed
        webhooks=agg.webhooks.counters(),
        senders=rx.get("senders", {}),  # per run/rank: nested, so not a Prometheus label
    )
    return out
