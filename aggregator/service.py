"""The aggregator: every part wired in one place.

    receive -> decode -> dedupe (SeqTracker) -> restarts -> health -> store.append -> merge
            -> divergence -> (tick) alerts -> incidents -> sinks (console, webhooks) -> live feed

One service thread runs the receive loop and, every ``flush_interval_s``, a tick (``tick.py``:
expire partial steps, evaluate alerts, publish feed increments, ask agents to resend gaps). A
second thread flushes the store, so a slow disk never stalls ingest (the store buffers, and
keeps what the disk refused). ``add()`` is the one entry for records, shared by the receiver
and imports, so live data and imports dedupe against each other. A lock makes ``add``, the
tick and ``snapshot`` safe to call from any thread.
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
    RanksBlock,
    Record,
    StepBlock,
    StepRecord,
    TelemetryRecord,
    unblock,
)
from rankwatch.aggregator import reads
from rankwatch.aggregator.actions.desk import ActionDesk, ActionError
from rankwatch.aggregator.actions.news import ActionNews
from rankwatch.aggregator.alerts.rules import Alert, AlertEngine
from rankwatch.aggregator.alerts.sinks.base import Sink
from rankwatch.aggregator.alerts.sinks.console import ConsoleSink
from rankwatch.aggregator.alerts.sinks.http import Webhooks
from rankwatch.aggregator.counters import service_counters
from rankwatch.aggregator.dedupe import as_blocks, dedupe
from rankwatch.aggregator.divergence.detector import (
    DivergenceDetector,
    QuietSteps,
    RankScore,
    StepResult,
)
from rankwatch.aggregator.feed import Feed, divergence_messages
from rankwatch.aggregator.health import Health, HealthTracker, RankHealth
from rankwatch.aggregator.healthview import HealthView
from rankwatch.aggregator.history import StoredRuns
from rankwatch.aggregator.incidents import IncidentTracker
from rankwatch.aggregator.ingest.newest import Newest, latest_values, observe_held
from rankwatch.aggregator.ingest.progress import ReceiveProgress
from rankwatch.aggregator.ingest.receiver import Receiver
from rankwatch.aggregator.merge import StepGrid, StepMerger, StepValues
from rankwatch.aggregator.outlet import IncidentOutlet, stored_number
from rankwatch.aggregator.ranksummary import DigestCache
from rankwatch.aggregator.resend import Resender
from rankwatch.aggregator.restarts import Restarts
from rankwatch.aggregator.seqs import SeqTracker
from rankwatch.aggregator.settings import (
    FLUSH_INTERVAL_S,
    HEALTH_EVERY_S,
    IMPORT_LIVE_WINDOW_S,
    LIVE_RETENTION_S,
    MAX_FEED_POINTS,
    SINK_CLOSE_S,
    STOP_TIMEOUT_S,
    STORE_RETRY_S,
    ServeConfig,
    tune_gc,
)
from rankwatch.aggregator.snapshot import RankInputs, build_snapshot, rank_inputs
from rankwatch.aggregator.stacks import StackIntake
from rankwatch.aggregator.store.db import Store, StoreError
from rankwatch.aggregator.store.flusher import Flusher
from rankwatch.aggregator.telemetry.intake import TelemetryIntake
from rankwatch.aggregator.tick import RETIRE_EVERY_S
from rankwatch.aggregator.tick import tick as run_tick

log = logging.getLogger("rankwatch.service")

__all__ = ["FLUSH_INTERVAL_S", "LIVE_RETENTION_S", "MAX_FEED_POINTS", "STORE_RETRY_S",
           "Aggregator", "ServeConfig", "tune_gc"]  # fmt: skip

COMMANDS_RESTORE_S = 3600.0  # commands this recent are taken back from the store at start


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
        # numbered on from the store's: a restarted serve must not reuse an old incident's id
        self.incidents = IncidentTracker(cfg.incidents, lambda run: stored_number(self.store, run))
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
        self._tick_steps: list[StepRecord | StepBlock | RanksBlock] = []
        self._tick_events: list[EventRecord] = []
        self.stacks = StackIntake()  # heartbeats' stack samples, drained by the tick
        self.healthview = HealthView(self.health)  # the snapshot the tick and readers share
        self.digests = DigestCache()  # big runs' summaries, per health snapshot
        self._summaries_due: list[tuple[str, Mapping[int, RankHealth]]] = []  # by the tick
        self._alerts_health_at = -HEALTH_EVERY_S  # when the alerts last saw the health
        self._alerts_changed: set[tuple[str, int]] = set()  # ranks changed since they did
        self._alerts_evaluated: set[tuple[str, int]] | None = None  # and evaluated (None: all)
        self._retired_at = -RETIRE_EVERY_S  # when runs over were last looked for
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
        # commands of an earlier serve still take their ranks' late answers, and are told once
        stored = self.store.commands(None, since=time.time() - COMMANDS_RESTORE_S)
        self.actions.restore(stored)
        self.news.restore(stored, self.store.incidents)
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
        records: Sequence[Record | StepBlock | RanksBlock],
        *,
        imported: bool = True,
        now: float | None = None,
    ) -> int:
        """Accept records from the wire or an import; returns how many were new (the rest
        were duplicates). The importer's sinks follow the same contract. A ``StepBlock`` (a
        batched frame) or ``RanksBlock`` (a relay's) counts as its records and goes through
        each stage whole.

        Imported records older than ``IMPORT_LIVE_WINDOW_S`` only go to the store."""
        now = time.time() if now is None else now
        with self.lock:
            made = self.restarts.restarts
            fresh, received = dedupe(as_blocks(records), self.seqs, self.restarts)
            made = self.restarts.restarts - made  # restart events: the aggregator's own records
            accepted = (
                sum(len(r) if isinstance(r, (StepBlock, RanksBlock)) else 1 for r in fresh) - made
            )
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

    def _live(self, fresh: list[Record | StepBlock | RanksBlock], now: float) -> None:
        """Health, latest values, merge and divergence for accepted records."""
        observe = self.health.observe
        merge, merge_block = self.merger.add, self.merger.add_block
        values = self.values
        tick_steps = self._tick_steps
        groups: list[StepValues | StepGrid] = []
        # Health only needs the newest step record of a rank in a batch; older ones are
        # observed only when an event or heartbeat of that rank must follow them in order.
        newest = Newest()
        for rec in fresh:
            if type(rec) is RanksBlock:
                tick_steps.append(rec)
                groups += self.merger.add_ranks(rec, now)
                latest_values(values, rec)
                newest.block(rec)
                continue
            key = (rec.run, rec.rank)
            if isinstance(rec, (StepRecord, StepBlock)):
                last = values.get(key)
                if last is None:
                    last = values[key] = {}
                tick_steps.append(rec)
                if isinstance(rec, StepBlock):
                    step = rec.record(-1)  # one metric set: the last is the latest
                    groups += merge_block(rec, now)
                else:
                    step = rec
                    groups += merge(rec, now)
                newest.step(key, step)
                last.update(step.metrics)
                continue
            held = newest.pop(key)
            if held is not None:
                observe_held(self.health, held, now)
            observe(rec, now)
            if type(rec) is TelemetryRecord:
                self.telemetry.take(rec)
            elif isinstance(rec, EventRecord):
                self._tick_events.append(rec)
            elif isinstance(rec, Heartbeat) and (rec.stack is not None or rec.stack_problem):
                self.stacks.take(rec)
        newest.observe(self.health, now)
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
        if (result.new or result.resolved) and self.feed.has_subscribers:
            stats = result.stats
            for state, items in (("new", result.new), ("resolved", result.resolved)):
                for message in divergence_messages(
                    stats.run, stats.metric, stats.step, state, items
                ):
                    self.feed.publish(message)

    def tick(self, now: float | None = None) -> list[Alert]:
        """The periodic pipeline (``tick.py``); returns the alert transitions."""
        return run_tick(self, now)

    def health_now(self, now: float) -> Health:
        """The tick's health snapshot (healthview.py); under the lock."""
        return self.healthview.snapshot(now)

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
        """Every command of ``run``, live and stored (``reads.py``)."""
        return reads.commands_of(self, run)

    def incidents_of(self, run: str) -> list[dict[str, Any]]:
        """Every incident of ``run``, live or stored (``reads.py``)."""
        return reads.incidents_of(self, run)

    # --- reading -----------------------------------------------------------------------------

    def rank_inputs_of(self, run: str, ranks: Mapping[int, RankHealth]) -> RankInputs:
        return rank_inputs(
            run, ranks, self.detector.flagged_on(run, ranks), self._z, self.values, self.seqs.gaps,
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
