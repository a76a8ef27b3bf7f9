"""The aggregator: every part wired in one place.

    receive -> decode -> dedupe (SeqTracker) -> restarts -> health -> store.append -> merge
            -> divergence -> (tick) alerts -> incidents -> sinks (console, webhooks) -> live feed

One service thread runs the receive loop and, every ``flush_interval_s``, a tick (expire partial
steps, evaluate alerts, publish feed increments, ask agents to resend gaps). A second thread
flushes the store, so a slow disk never stalls ingest (the store buffers, and keeps what the
disk refused). ``add()`` is the one entry for records, shared by the receiver and imports, so
live data and imports dedupe against each other. A lock makes ``add``, the tick and
``snapshot`` safe to call from any thread.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rankwatch.agent.wire.records import (
    EventRecord,
    Heartbeat,
    Record,
    StepBlock,
    StepRecord,
    TelemetryRecord,
    unblock,
)
from rankwatch.aggregator.actions.desk import ActionDesk, ActionError, annotate
from rankwatch.aggregator.actions.news import ActionNews
from rankwatch.aggregator.alerts.rules import Alert, AlertEngine
from rankwatch.aggregator.alerts.sinks.base import Sink
from rankwatch.aggregator.alerts.sinks.console import ConsoleSink
from rankwatch.aggregator.alerts.sinks.fanout import deliver
from rankwatch.aggregator.alerts.sinks.http import Webhooks
from rankwatch.aggregator.alerts.sinks.words import alert_dict
from rankwatch.aggregator.counters import service_counters
from rankwatch.aggregator.dedupe import dedupe
from rankwatch.aggregator.divergence.detector import (
    DivergenceDetector,
    QuietSteps,
    RankScore,
    StepResult,
)
from rankwatch.aggregator.feed import Feed, event_message, jsonable, points_messages
from rankwatch.aggregator.health import HealthTracker, RankHealth
from rankwatch.aggregator.healthview import ROLLING_RANKS, HealthView
from rankwatch.aggregator.history import StoredRuns
from rankwatch.aggregator.incidents import IncidentTracker
from rankwatch.aggregator.incidents.model import Incident
from rankwatch.aggregator.ingest.progress import ReceiveProgress
from rankwatch.aggregator.ingest.receiver import Receiver
from rankwatch.aggregator.merge import StepGrid, StepMerger, StepValues, as_blocks
from rankwatch.aggregator.outlet import IncidentOutlet, live_dicts
from rankwatch.aggregator.ranksummary import SUMMARY_RANKS, DigestCache
from rankwatch.aggregator.resend import Resender
from rankwatch.aggregator.restarts import Restarts
from rankwatch.aggregator.seqs import SeqTracker
from rankwatch.aggregator.settings import (
    FLUSH_INTERVAL_S,
    HEALTH_EVERY_S,
    IMPORT_LIVE_WINDOW_S,
    LIVE_RETENTION_S,
    MAX_FEED_POINTS,
    RANKS_REFRESH_S,
    SINK_CLOSE_S,
    STOP_TIMEOUT_S,
    STORE_RETRY_S,
    ServeConfig,
    tune_gc,
)
from rankwatch.aggregator.snapshot import RankInputs, build_snapshot, rank_entries, rank_inputs
from rankwatch.aggregator.stacks import StackIntake
from rankwatch.aggregator.store.db import Store, StoreError
from rankwatch.aggregator.store.flusher import Flusher
from rankwatch.aggregator.telemetry.intake import TelemetryIntake

log = logging.getLogger("rankwatch.service")

__all__ = ["FLUSH_INTERVAL_S", "LIVE_RETENTION_S", "MAX_FEED_POINTS", "STORE_RETRY_S",
           "Aggregator", "ServeConfig", "tune_gc"]  # fmt: skip

COMMANDS_RESTORE_S = 3600.0  # commands this recent are taken back from the store at start


def _no_route(run: str, rank: int, message: dict[str, Any]) -> bool:
    return False


class Aggregator:
    """See the module docstring. ``start()`` binds the ingest port; ``stop()`` flushes."""

    def __init__(self, config: ServeConfig | None = None, *, store: Store | None = None) -> None:
        self.config = cfg = config or ServeConfig()
        self.store = store if store is not None else Store(Path(cfg.data_dir))
        self.feed = Feed()
        self.seqs = SeqTracker()
        self.restarts = Restarts()
        self.health = HealthTracker(lost_after_s=cfg.lost_after_s, min_stall_s=cfg.min_stall_s)
        self.merger = StepMerger(grace_s=cfg.merge_grace_s)
        self.detector = DivergenceDetector(cfg.divergence)
        self.alerts = AlertEngine(cfg.alerts, cfg.divergence)
        self.incidents = IncidentTracker(cfg.incidents)
        self.telemetry = TelemetryIntake(cfg.telemetry)  # hardware findings and card notes
        self.actions = ActionDesk(cfg.policies)  # policies and commands to the ranks
        self.news = ActionNews()  # what the incidents' messages say was done about them
        self.webhooks = Webhooks(cfg.webhooks, cfg.public_url)
        self.sinks: list[Sink] = list(self.webhooks.sinks)
        if cfg.console_alerts:
            self.sinks.append(ConsoleSink(public_url=cfg.public_url))
        self.receiver: Receiver | None = None
        self.progress = ReceiveProgress(time.time())  # how far ingest is behind (live only)
        self.lock = threading.RLock()  # add, tick and the snapshot's copy hold it
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        # Per-tick buffers, emptied by the tick.
        self._results: list[StepResult | QuietSteps] = []
        self._tick_steps: list[StepRecord | StepBlock] = []
        self._tick_events: list[EventRecord] = []
        self.stacks = StackIntake()  # heartbeats' stack samples, drained by the tick
        self.healthview = HealthView(self.health)  # the snapshot the tick and readers share
        self.digests = DigestCache()  # big runs' summaries, per health snapshot
        self._summaries_due: list[tuple[str, Mapping[int, RankHealth]]] = []  # by the tick
        self._alerts_health_at = -HEALTH_EVERY_S  # when the alerts last saw the health
        # Latest values for the snapshot.
        self.values: dict[tuple[str, int], dict[str, float]] = {}  # latest per (run, rank)
        self._z: dict[tuple[str, str], Mapping[int, RankScore]] = {}
        self._ranks_sent: dict[str, float] = {}
        self.resender = Resender()
        self.stored_runs = StoredRuns(self.store)
        self.outlet = IncidentOutlet(
            self.incidents, self.store, self.feed, note=self.telemetry.annotate_dict
        )
        self.flusher = Flusher(
            self.store,
            max(cfg.store_flush_s, cfg.flush_interval_s),
            cfg.store_backlog_records,
            STORE_RETRY_S,
            cfg.store_flush_max_s,
        )
        self.n = {
            "received": 0, "accepted": 0, "duplicates": 0, "imported": 0,
            "resend_requests": 0, "sink_errors": 0, "feed_sampled_ticks": 0, "internal_errors": 0,
        }  # fmt: skip
        self._logged_errors: set[str] = set()

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Rebuild dedupe state from the store, bind the ingest port, start the threads."""
        if self._started:
            return
        for run, rank, inc, lo, hi in self.store.seen_seqs():
            self.seqs.load(run, rank, lo, hi, inc)
        # commands of an earlier serve still take their ranks' late answers
        self.actions.restore(self.store.commands(None, since=time.time() - COMMANDS_RESTORE_S))
        cfg = self.config
        self.receiver = Receiver(cfg.ingest_host, cfg.ingest_port, curve_dir=cfg.curve_dir)
        self.progress = ReceiveProgress(time.time())
        self._started = True
        self._stop.clear()
        flush = functools.partial(self.flusher.run, self._stop)
        for name, target in (("ingest", self._ingest_loop), ("flush", flush)):
            thread = threading.Thread(target=target, name=f"rankwatch-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def ingest_port(self) -> int:
        """The bound ingest port (useful with ingest_port=0); 0 before start()."""
        return self.receiver.port if self.receiver is not None else 0

    def stop(self) -> None:
        """Stop the threads, run a last tick, flush and close the store. Idempotent."""
        if self._stop.is_set() and not self._threads:
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(STOP_TIMEOUT_S)
        self._threads.clear()
        if self._started:
            self.tick()
        self.n["sink_errors"] += self.outlet.release(self.sinks)
        deadline = time.monotonic() + SINK_CLOSE_S
        for sink in self.sinks:
            sink.close(max(0.1, deadline - time.monotonic()))
        self.feed.close()
        try:
            self.store.close()
        except StoreError as exc:
            log.error("rankwatch: the last records could not be stored: %s", exc)

    def __enter__(self) -> Aggregator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ingest_loop(self) -> None:
        receiver = self.receiver
        assert receiver is not None
        interval = self.config.flush_interval_s
        next_tick = time.monotonic() + interval
        progress = self.progress
        cpu = time.thread_time()
        try:
            while not self._stop.is_set():
                wait_ms = min(100, max(0, int((next_tick - time.monotonic()) * 1000)))
                try:
                    batch = receiver.recv(wait_ms)
                    if batch:
                        self.add(batch, imported=False)
                    used = time.thread_time()  # the loop's own work is no gap (progress.py)
                    progress.passed(time.time(), wait_ms / 1000, used - cpu)
                    cpu = used
                    if time.monotonic() >= next_tick:
                        next_tick = max(next_tick + interval, time.monotonic())
                        progress.read(receiver.heard_until())  # what is read is taken in
                        self.tick()
                except Exception as exc:  # a bug must cost one batch, not the aggregator
                    self._internal_error(exc)
        finally:
            receiver.close()

    def _internal_error(self, exc: Exception) -> None:
        self.n["internal_errors"] += 1
        kind = type(exc).__name__
        if kind not in self._logged_errors:
            self._logged_errors.add(kind)
            log.exception("rankwatch: internal error (%s); ingest goes on, please report", kind)

    def flush_store(self) -> bool:
        """Write buffered records now (the flush thread does it on its own); False when the
        store refused them (they stay buffered, retried every ``STORE_RETRY_S``)."""
        return self.flusher.flush()

    # --- the pipeline --------------------------------------------------------------------

    def add(
        self,
        records: Sequence[Record | StepBlock],
        *,
        imported: bool = True,
        now: float | None = None,
    ) -> int:
        """Accept records from the wire or an import; returns how many were new (the rest
        were duplicates). The importer's sinks follow the same contract. A ``StepBlock`` (a
        batched frame) counts as its records and goes through each stage whole.

        Imported records older than ``IMPORT_LIVE_WINDOW_S`` only go to the store."""
        now = time.time() if now is None else now
        with self.lock:
            made = self.restarts.restarts
            fresh, received = dedupe(as_blocks(records), self.seqs, self.restarts)
            made = self.restarts.restarts - made  # restart events: the aggregator's own records
            accepted = sum(len(r) if type(r) is StepBlock else 1 for r in fresh) - made
            n = self.n
            n["received"] += received
            n["duplicates"] += received - accepted
            if imported:
                n["imported"] += accepted
            if not fresh:
                return 0
            try:
                self.store.append(fresh)
            except StoreError as exc:  # only when closed: the process is stopping
                log.error("rankwatch: records not stored: %s", exc)
            if imported:
                # An imported history is stored, not replayed: its ranks must not turn "lost"
                # (and alert) ten seconds from now. A recent import (a live run's backfill)
                # goes through the live path like traffic from the wire.
                fresh = [r for r in unblock(fresh) if r.time >= now - IMPORT_LIVE_WINDOW_S]
            self._live(fresh, now)
            n["accepted"] += accepted  # counted once processed (benchmarks wait on it)
        return accepted

    def _live(self, fresh: list[Record | StepBlock], now: float) -> None:
        """Health, latest values, merge and divergence for accepted records."""
        observe = self.health.observe
        merge, merge_block = self.merger.add, self.merger.add_block
        values = self.values
        tick_steps = self._tick_steps
        groups: list[StepValues | StepGrid] = []
        # Health only needs the newest step record of a rank in a batch; older ones are
        # observed only when an event or heartbeat of that rank must follow them in order.
        newest: dict[tuple[str, int], StepRecord] = {}
        for rec in fresh:
            key = (rec.run, rec.rank)
            if isinstance(rec, (StepRecord, StepBlock)):
                last = values.get(key)
                if last is None:
                    last = values[key] = {}
                tick_steps.append(rec)
                if isinstance(rec, StepBlock):
                    step = newest[key] = rec.record(-1)  # one metric set: the last is the latest
                    groups += merge_block(rec, now)
                else:
                    step = newest[key] = rec
                    groups += merge(rec, now)
                last.update(step.metrics)
                continue
            held = newest.pop(key, None)
            if held is not None:
                observe(held, now)
            observe(rec, now)
            if type(rec) is TelemetryRecord:
                self.telemetry.take(rec)
            elif isinstance(rec, EventRecord):
                self._tick_events.append(rec)
            elif isinstance(rec, Heartbeat) and (rec.stack is not None or rec.stack_problem):
                self.stacks.take(rec)
        for rec in newest.values():
            observe(rec, now)
        # scored together: runs of quiet steps cost a few numpy calls (divergence_batch.py)
        for result in self.detector.update_many(groups):
            self._take(result)

    def _take(self, result: StepResult | QuietSteps) -> None:
        self._results.append(result)
        # the latest scores; z is read from them only when shown
        if isinstance(result, QuietSteps):
            self._z[(result.run, result.metric)] = result.last_scores()
            return
        if result.scores:
            self._z[(result.stats.run, result.stats.metric)] = result.scores
        if result.new or result.resolved:
            for state, items in (("new", result.new), ("resolved", result.resolved)):
                for d in items:
                    self.feed.publish({"type": "divergence", "state": state, **jsonable(d)})

    def tick(self, now: float | None = None) -> list[Alert]:
        """Periodic work; returns the alert transitions (the service thread calls it)."""
        now = time.time() if now is None else now
        with self.lock:
            if self.receiver is not None and not self._stop.is_set():  # not stop()'s last
                self._judge_silence(now)
            for result in self.detector.update_many(self.merger.expire(now)):
                self._take(result)
            health = self.healthview.snapshot(now)
            changed = self.healthview.changes(now, health)
            results, self._results = self._results, []
            hardware = self.telemetry.tick()
            transitions = self.alerts.evaluate(
                now, results=results, health=self._health_for_alerts(now, health, changed),
                hardware=hardware,
            )  # fmt: skip
            new = [d for r in results if isinstance(r, StepResult) for d in r.new]
            incidents = self.incidents.observe(
                now,
                divergences=new,
                resolved=[d for r in results if isinstance(r, StepResult) for d in r.resolved],
                alerts=transitions,
                health=changed,
                stacks=self.stacks.drain(self.store),
            )
            incidents = [self.telemetry.annotate(c) for c in incidents]  # culprits' card notes
            touched = {h.run for h, _ in changed} | {d.run for d in new}
            bodies, covered = self.outlet.judge(incidents, transitions, touched, health)
            tables: list[tuple[str, RankInputs]] = []
            steps, self._tick_steps = self._tick_steps, []
            events, self._tick_events = self._tick_events, []
            if self.feed.has_subscribers:
                self._publish_points(steps)
                self._publish_events(events)
                tables = self._ranks_due(health, {h.run for h, _ in changed}, now)
                for message in self.telemetry.feed_messages(now):
                    self.feed.publish(message)
            if self.config.resend_gaps:
                self._request_resends(health, now)
            self._retire_runs(health, now)
            send = self.receiver.send_command if self.receiver is not None else _no_route
            commands = self.actions.turn(
                now, health, incidents, events, steps, send, self.restarts.current
            )
            incidents, news = self.news.take(
                incidents, commands, self.actions.commands, self._live_incident
            )
        for run, inputs in tables:  # built without the lock, as the snapshot's are
            self.feed.publish({"type": "ranks", "run": run, "ranks": rank_entries(inputs)})
        summaries, self._summaries_due = self._summaries_due, []
        for run, ranks in summaries:  # a snapshot is never changed: read without the lock
            counts = self.digests.get(run, ranks, now).rank_states
            message = {"type": "ranks", "run": run, "summary": True, "ranks_seen": len(ranks)}
            self.feed.publish({**message, "rank_states": counts})
        self.n["sink_errors"] += self.outlet.announce(incidents, bodies, self.sinks, now)
        # the commands about an incident settled: one message, after its held first one
        self.n["sink_errors"] += self.outlet.tell(news, self.sinks, now)
        for body in commands:
            self._command(body)
        for alert, hit in zip(transitions, covered, strict=True):
            self.feed.publish({"type": "alert", **alert_dict(alert)})
            self.n["sink_errors"] += deliver(self.sinks, alert, covered=hit)
        return transitions

    def _live_incident(self, run: str, ident: str) -> Incident | None:
        return next((i for i in self.incidents.incidents(run) if i.id == ident), None)

    def _judge_silence(self, now: float) -> None:
        """Rank silence is judged up to what ingest has taken in (``progress.py``)."""
        self.health.heard(self.progress.heard)
        worst = self.progress.caught_up(now)
        if worst is not None:
            log.warning("rankwatch: aggregator fell behind by %.1f s; rank silence not judged",
                        worst)  # fmt: skip

    def _health_for_alerts(
        self,
        now: float,
        health: dict[str, dict[int, RankHealth]],
        changed: list[tuple[RankHealth, str]],
    ) -> dict[str, dict[int, RankHealth]] | None:
        """The snapshot for the alert engine's health rules (a pass over every rank), or None
        (their conditions stand): after a sweep, or when a rank entered or left a state they
        alert on (a new rank that is alive changes none); beyond ``ROLLING_RANKS`` ranks at
        most every ``HEALTH_EVERY_S`` but for a crash. Ranks flipping between lost and alive
        behind a backlog would otherwise make every tick a pass over every rank."""
        swept = self.healthview.take_swept()
        moved = any(h.state.value != "alive" or old not in ("", "alive") for h, old in changed)
        urgent = any(h.state.value == "crashed" for h, _ in changed)
        waited = not 0 <= now - self._alerts_health_at < HEALTH_EVERY_S
        if swept or (moved and (urgent or waited or self.health.count() <= ROLLING_RANKS)):
            self._alerts_health_at = now
            return health
        return None

    def health_now(self, now: float) -> dict[str, dict[int, RankHealth]]:
        """The tick's health snapshot (healthview.py); under the lock."""
        return self.healthview.snapshot(now)

    def _retire_runs(self, health: dict[str, dict[int, RankHealth]], now: float) -> None:
        """Forget the live state of runs over for a long while (the store keeps them, and the
        seq tracker too, so a late duplicate is still recognised)."""
        for run, ranks in health.items():
            over = all(h.state.value in ("finished", "crashed", "lost") for h in ranks.values())
            if not over:
                continue
            last = max((h.last_seen for h in ranks.values()), default=now)
            if now - last > LIVE_RETENTION_S:
                for part in (self.health, self.merger, self.detector, self.incidents,
                             self.telemetry):  # fmt: skip
                    part.forget(run)
                for key in [k for k in self.values if k[0] == run]:
                    del self.values[key]
                for zkey in [k for k in self._z if k[0] == run]:
                    del self._z[zkey]
                self._ranks_sent.pop(run, None)

    def _publish_points(self, steps: list[StepRecord | StepBlock]) -> None:
        messages, sampled = points_messages(steps, MAX_FEED_POINTS)
        self.n["feed_sampled_ticks"] += sampled
        for message in messages:
            self.feed.publish(message)

    def _publish_events(self, events: list[EventRecord]) -> None:
        for ev in events:
            self.feed.publish(event_message(ev))

    def _command(self, body: dict[str, Any]) -> None:
        try:
            self.store.append_command(body)
        except StoreError as exc:  # only when closed: the process is stopping
            log.error("rankwatch: command not stored: %s", exc)
        self.feed.publish({"type": "command", "run": body["run"], "command": body})

    def issue_command(self, run: str, kind: str, *, by: str, **how: Any) -> dict[str, Any]:
        """A command to a live run's ranks (``ActionDesk.issue``: ``ranks``, ``text``,
        ``reason``, ``incident``: an open incident of the run it was asked from); sent at the
        next tick. ActionError says why it cannot be."""
        incident = how.get("incident")
        if incident and not any(i["id"] == incident and i.get("state") == "firing"
                                for i in self.incidents_of(run)):  # fmt: skip
            raise ActionError(f"run {run!r} has no open incident {incident!r}")
        with self.lock:
            now = time.time()
            health = self.healthview.snapshot(now)
            self.actions.steps(self._tick_steps)  # the steps since the last tick count too
            issued = self.actions.issue(run, kind, health, now, self.restarts.current, by=by,
                                        wait_s=self.config.flush_interval_s, **how)  # fmt: skip
            return issued.as_dict()

    def commands_of(self, run: str) -> list[dict[str, Any]]:
        """Every command of ``run`` with its answers, newest first: live and stored."""
        with self.lock:
            live = {c["id"]: c for c in self.actions.commands(run)}
        stored = {c["id"]: c for c in self.store.commands(run)}
        merged = {**stored, **live}
        return sorted(merged.values(), key=lambda c: (c["created"], c["id"]), reverse=True)

    def incidents_of(self, run: str) -> list[dict[str, Any]]:
        """Every incident of ``run``, newest first, live or stored (``IncidentOutlet.read``)."""
        with self.lock:
            note = self.telemetry.annotate_dict
            live = [note(body) for body in live_dicts(self.incidents, run)]
        merged = {inc["id"]: inc for inc in self.outlet.read(run, live)}
        annotate(merged, self.commands_of(run))  # what a policy did about each, and the answers
        return sorted(merged.values(), key=lambda i: (i.get("opened", 0.0), i["id"]), reverse=True)

    def _ranks_due(
        self, health: dict[str, dict[int, RankHealth]], changed: set[str], now: float
    ) -> list[tuple[str, RankInputs]]:
        """The inputs of the rank tables to stream this tick (copied: built after the lock)."""
        due = []
        for run, ranks in health.items():
            big = len(ranks) > SUMMARY_RANKS  # every few seconds: a new rank is a change
            if (run in changed and not big) or (
                now - self._ranks_sent.get(run, 0.0) >= RANKS_REFRESH_S
            ):
                self._ranks_sent[run] = now
                if big:  # no table: its counts (the page reads the ranks a page at a time)
                    self._summaries_due.append((run, ranks))
                    continue
                due.append((run, self.rank_inputs_of(run, ranks)))
        return due

    def _request_resends(self, health: dict[str, dict[int, RankHealth]], now: float) -> None:
        if self.receiver is not None:
            self.n["resend_requests"] += self.resender.request(
                health, now, self.seqs, self.restarts.current, self.receiver.request_resend
            )

    # --- reading -----------------------------------------------------------------------------

    def rank_inputs_of(self, run: str, ranks: dict[int, RankHealth]) -> RankInputs:
        return rank_inputs(
            run, ranks, self.detector.active(run), self._z, self.values, self.seqs.gaps,
            self.restarts.current,
        )  # fmt: skip

    def snapshot(
        self,
        now: float | None = None,
        *,
        run: str | None = None,
        ranks: bool = True,
        history: bool = False,
        summary: bool = False,
        page: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """Live state of every run the aggregator has heard from (or of ``run``), JSON-ready.

        ``ranks=False`` leaves out the per-rank entries (slow to build at thousands, under the
        lock ingest needs) and gives ``ranks_seen`` and the live ``metrics`` names instead.
        ``history``: every stored run too, live or not (``history: true`` and its final state
        for those without live state; history.py), newest first, and each live run's
        ``record_time``, the time its latest stored record carries (the training's clock: an
        import's records arrive now but were written long ago).

        ``summary``: a run of more than ``SUMMARY_RANKS`` ranks lists only its odd ranks, with
        its counts by state (ranksummary.py); ``page`` (offset, limit): every run lists that
        page of its ranks in rank order, with the same counts."""
        now = time.time() if now is None else now
        return build_snapshot(self, now, run, ranks, history, summary, page)

    def counters(self) -> dict[str, Any]:
        """Flat-ish counters (Prometheus takes one level of nesting as a label)."""
        return service_counters(self)
