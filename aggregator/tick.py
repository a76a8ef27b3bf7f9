"""The aggregator's tick: the periodic pipeline the service thread runs every
``flush_interval_s`` (``Aggregator.tick``).

    expire partial steps -> divergence -> health -> alerts -> incidents -> feed (points,
    events, rank tables) -> resend requests -> retire runs over -> actions -> sinks

It works on the aggregator's parts and per-tick buffers (``service.py``), under its lock; the
rank tables and summaries are built, and the sinks called, after it is released.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from rankwatch.agent.wire.records import EventRecord, RanksBlock, StepBlock, StepRecord
from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.fanout import deliver
from rankwatch.aggregator.alerts.sinks.words import alert_dict
from rankwatch.aggregator.divergence.detector import StepResult
from rankwatch.aggregator.feed import event_messages, points_messages
from rankwatch.aggregator.health import OVER_STATES, Health, RankHealth
from rankwatch.aggregator.healthview import ROLLING_RANKS
from rankwatch.aggregator.incidents.model import Incident
from rankwatch.aggregator.ranksummary import SUMMARY_RANKS
from rankwatch.aggregator.settings import (
    HEALTH_EVERY_S,
    LIVE_RETENTION_S,
    MAX_FEED_POINTS,
    RANKS_REFRESH_S,
)
from rankwatch.aggregator.snapshot import RankInputs, rank_entries
from rankwatch.aggregator.store.db import StoreError

if TYPE_CHECKING:
    from rankwatch.aggregator.service import Aggregator

log = logging.getLogger("rankwatch.service")

EXPIRE_RANKS = 100_000  # partial steps handed out per tick, in ranks (a 100,000-rank step)
RETIRE_EVERY_S = 60.0  # runs over for LIVE_RETENTION_S are looked for this often


def _no_route(run: str, rank: int, message: dict[str, Any]) -> bool:
    return False


def tick(agg: Aggregator, now: float | None = None) -> list[Alert]:
    """Periodic work; returns the alert transitions (the service thread calls it)."""
    now = time.time() if now is None else now
    with agg.lock:
        taken_in, per_tick = now, None
        if agg.receiver is not None and not agg._stop.is_set():  # not stop()'s last
            _judge_silence(agg, now)
            # A step's grace for its slowest rank is counted up to what ingest has taken in,
            # as silence is: behind a backlog the rest of the step is still queued, and a
            # step scored partial for the head node's own lag would miss every late value.
            taken_in = min(now, agg.progress.heard)
            # Partial steps are scored here, under the lock: a backlog's worth at once would
            # hold reads up for seconds at 100,000 ranks, so a tick takes ``EXPIRE_RANKS``.
            per_tick = EXPIRE_RANKS
        for result in agg.detector.update_many(agg.merger.expire(taken_in, per_tick)):
            agg._take(result)
        health = agg.healthview.snapshot(now)
        changed = agg.healthview.changes(now, health)
        results, agg._results = agg._results, []
        hardware = agg.telemetry.tick()
        for_alerts, moved, stepped = _health_for_alerts(agg, now, health, changed)
        transitions = agg.alerts.evaluate(
            now, results=results, health=for_alerts, hardware=hardware, health_changed=moved,
            health_evaluated=stepped,
        )  # fmt: skip
        new = [d for r in results if isinstance(r, StepResult) for d in r.new]
        incidents = agg.incidents.observe(
            now,
            divergences=new,
            resolved=[d for r in results if isinstance(r, StepResult) for d in r.resolved],
            alerts=transitions,
            health=changed,
            stacks=agg.stacks.drain(agg.store),
        )
        incidents = [agg.telemetry.annotate(c) for c in incidents]  # culprits' card notes
        touched = {h.run for h, _ in changed} | {d.run for d in new}
        bodies, covered = agg.outlet.judge(incidents, transitions, touched, health)
        tables: list[tuple[str, RankInputs]] = []
        steps, agg._tick_steps = agg._tick_steps, []
        events, agg._tick_events = agg._tick_events, []
        if agg.feed.has_subscribers:
            _publish_points(agg, steps)
            _publish_events(agg, events)
            tables = _ranks_due(agg, health, {h.run for h, _ in changed}, now)
            for message in agg.telemetry.feed_messages(now):
                agg.feed.publish(message)
        if agg.config.resend_gaps:
            agg.resender.wake((h.run, h.rank) for h, _ in changed)
            _request_resends(agg, health, now)
        retire_runs(agg, health, now)
        send = agg.receiver.send_command if agg.receiver is not None else _no_route
        commands = agg.actions.turn(
            now, health, incidents, events, steps, send, agg.restarts.current
        )
        incidents, news = agg.news.take(
            incidents, commands, agg.actions.commands, functools.partial(_live_incident, agg)
        )
    for run, inputs in tables:  # built without the lock, as the snapshot's are
        agg.feed.publish({"type": "ranks", "run": run, "ranks": rank_entries(inputs)})
    summaries, agg._summaries_due = agg._summaries_due, []
    for run, ranks in summaries:  # a snapshot is never changed: read without the lock
        counts = agg.digests.get(run, ranks, now).rank_states
        message = {"type": "ranks", "run": run, "summary": True, "ranks_seen": len(ranks)}
        agg.feed.publish({**message, "rank_states": counts})
    agg.n["sink_errors"] += agg.outlet.announce(incidents, bodies, agg.sinks, now)
    # the commands about an incident settled: one message, after its held first one
    agg.n["sink_errors"] += agg.outlet.tell(news, agg.sinks, now)
    for body in commands:
        _command(agg, body)
    for alert, hit in zip(transitions, covered, strict=True):
        agg.feed.publish({"type": "alert", **alert_dict(alert)})
        agg.n["sink_errors"] += deliver(agg.sinks, alert, covered=hit)
    return transitions


def _live_incident(agg: Aggregator, run: str, ident: str) -> Incident | None:
    return next((i for i in agg.incidents.incidents(run) if i.id == ident), None)


def _judge_silence(agg: Aggregator, now: float) -> None:
    """Rank silence is judged up to what ingest has taken in (``progress.py``)."""
    agg.health.heard(agg.progress.heard)
    worst = agg.progress.caught_up(now)
    if worst is not None:
        log.warning("rankwatch: aggregator fell behind by %.1f s; rank silence not judged",
                    worst)  # fmt: skip


def _health_for_alerts(
    agg: Aggregator,
    now: float,
    health: Health,
    changed: list[tuple[RankHealth, str]],
) -> tuple[Health | None, set[tuple[str, int]], set[tuple[str, int]] | None]:
    """The snapshot for the alert engine's health rules, or None (their conditions
    stand), and the ranks whose state changed since its last one: after a sweep, or when a
    rank entered or left a state they alert on (a new rank that is alive changes none);
    beyond ``ROLLING_RANKS`` ranks at most every ``HEALTH_EVERY_S`` but for a crash."""
    agg._alerts_changed.update((h.run, h.rank) for h, _ in changed)
    evaluated = agg.healthview.take_evaluated()
    if evaluated is None or agg._alerts_evaluated is None:
        agg._alerts_evaluated = None
    else:
        agg._alerts_evaluated |= evaluated
    swept = agg.healthview.take_swept()
    moved = any(h.state.value != "alive" or old not in ("", "alive") for h, old in changed)
    urgent = any(h.state.value == "crashed" for h, _ in changed)
    waited = not 0 <= now - agg._alerts_health_at < HEALTH_EVERY_S
    if swept or (moved and (urgent or waited or agg.health.count() <= ROLLING_RANKS)):
        agg._alerts_health_at = now
        moved_ranks, agg._alerts_changed = agg._alerts_changed, set()
        stepped, agg._alerts_evaluated = agg._alerts_evaluated, set()
        return health, moved_ranks, stepped
    return None, set(), set()


def retire_runs(agg: Aggregator, health: Health, now: float) -> None:
    """Forget the live state of runs over for a long while (the store keeps them, and the
    seq tracker too, so a late duplicate is still recognised). Looked for at most every
    ``RETIRE_EVERY_S``: the look is a pass over every rank until one is alive, which with
    thousands of ranks lost was most of a tick."""
    if 0 <= now - agg._retired_at < RETIRE_EVERY_S:
        return
    agg._retired_at = now
    for run, ranks in health.items():
        if not all(h.state in OVER_STATES for h in ranks.values()):
            continue
        last = max((h.last_seen for h in ranks.values()), default=now)
        if now - last > LIVE_RETENTION_S:
            for part in (agg.health, agg.merger, agg.detector, agg.incidents,
                         agg.telemetry):  # fmt: skip
                part.forget(run)
            for key in [k for k in agg.values if k[0] == run]:
                del agg.values[key]
            for zkey in [k for k in agg._z if k[0] == run]:
                del agg._z[zkey]
            agg._ranks_sent.pop(run, None)


def _publish_points(agg: Aggregator, steps: list[StepRecord | StepBlock | RanksBlock]) -> None:
    messages, sampled = points_messages(steps, MAX_FEED_POINTS)
    agg.n["feed_sampled_ticks"] += sampled
    for message in messages:
        agg.feed.publish(message)


def _publish_events(agg: Aggregator, events: list[EventRecord]) -> None:
    for message in event_messages(events):
        agg.feed.publish(message)


def _command(agg: Aggregator, body: dict[str, Any]) -> None:
    try:
        agg.store.append_command(body)
    except StoreError as exc:  # only when closed: the process is stopping
        log.error("rankwatch: command not stored: %s", exc)
    agg.feed.publish({"type": "command", "run": body["run"], "command": body})


def _ranks_due(
    agg: Aggregator, health: Health, changed: set[str], now: float
) -> list[tuple[str, RankInputs]]:
    """The inputs of the rank tables to stream this tick (copied: built after the lock)."""
    due = []
    for run, ranks in health.items():
        big = len(ranks) > SUMMARY_RANKS  # every few seconds: a new rank is a change
        if (run in changed and not big) or (now - agg._ranks_sent.get(run, 0.0) >= RANKS_REFRESH_S):
            agg._ranks_sent[run] = now
            if big:  # no table: its counts (the page reads the ranks a page at a time)
                agg._summaries_due.append((run, ranks))
                continue
            due.append((run, agg.rank_inputs_of(run, ranks)))
    return due


def _request_resends(agg: Aggregator, health: Health, now: float) -> None:
    if agg.receiver is not None:
        agg.n["resend_requests"] += agg.resender.request(
            health, now, agg.seqs, agg.restarts.current, agg.receiver.request_resend
        )
