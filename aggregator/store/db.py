"""The history store: every accepted record on disk (DuckDB), behind a narrow interface.

``append`` only buffers (any thread); ``flush`` writes the buffer in one transaction of bulk
inserts from numpy columns with the series rollups (``write.py``), then settles the cross-rank
band of the runs that can move on in a second one (``band.py``), so a ``kill -9`` leaves
either all of each or none of it (DuckDB's WAL). Reads are safe from any thread (``reads.py``)
and see committed flushes only. Opening, tables and upgrades: ``schema.py``. See
docs/storage.md.

What a flush cannot write never stops the ones after it: a disk that refuses keeps the records
buffered (up to MAX_BUFFER_ROWS) for the next flush; records DuckDB refuses for any other
reason are narrowed down by halves and the piece that still fails alone is set aside as JSONL
(``rankwatch import`` takes it back) and counted; a band that cannot be settled is retried for
fewer runs at a time, and a run that fails alone waits for its next records.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any, NoReturn

import duckdb
import numpy as np
from rankwatch.agent.wire.records import RanksBlock, StepBlock, StepRecord
from rankwatch.aggregator.store import band, openbuckets, reads, rollup, seen, write
from rankwatch.aggregator.store import commands as stored_commands
from rankwatch.aggregator.store import incidents as stored_incidents
from rankwatch.aggregator.store import stacks as stored_stacks
from rankwatch.aggregator.store.buffer import Batch
from rankwatch.aggregator.store.parts import Item
from rankwatch.aggregator.store.rows import Mirror
from rankwatch.aggregator.store.schema import (
    MEMORY_LIMIT,
    SCHEMA_VERSION,
    STORE_FILENAME,
    StoreError,
    connect,
    create,
    open_reason,
)
from rankwatch.aggregator.store.setaside import set_aside
from rankwatch.aggregator.store.telemetry_reads import TelemetryReads

__all__ = ["SCHEMA_VERSION", "STORE_FILENAME", "Store", "StoreError"]

log = logging.getLogger("rankwatch.store")

MAX_BUFFER_ROWS = 5_000_000  # rows held in memory while the disk refuses them (~400 MB)
BAND_STALE_S = 30.0  # a rank without a step record this long no longer holds back the band
BAND_WAIT_UNSEEN_S = 60.0  # ranks of world_size never seen hold it back this long
BAND_REPAIR_QUIET_S = 10.0  # a run with late rows is re-banded after this long without input
BAND_REPAIR_ROWS = 200_000  # ... or at once if re-banding reads fewer raw rows than this
BAND_RUNS = 100_000  # runs settled per flush at most; halved after a failed settle
CLOSE_WAIT_S = 5.0  # close() waits this long for a running flush, then interrupts it
CLOSE_POLL_S = 0.2  # ... again at this period
CLOSE_INTERRUPT_S = 10.0  # ... for this long at most, then gives up on the last flush
# Errors that say the disk or the connection refuses, not the records: those stay buffered
_KEEP = (duckdb.IOException, duckdb.InterruptException, duckdb.FatalException, OSError)
_KEEP_MARKS = ("could not write", "no space", "file too large", "read-only", "permission denied",
               "failed to commit")  # fmt: skip


class Store(reads.Reads, TelemetryReads):
    """DuckDB-backed history of every accepted record; see the module docstring."""

    def __init__(
        self,
        path: Path | str,
        *,
        memory_limit: str = MEMORY_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        path = Path(path)
        if path.suffix not in (".duckdb", ".db"):
            path = path / STORE_FILENAME
        self.path = path
        self._clock = clock
        self._con = connect(path, memory_limit)
        self._writer = self._con.cursor()
        self._reads = reads.Cursors(self._con)
        self._buf_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._buf = Batch()
        self._buf_ranks: set[tuple[str, int]] = set()  # ranks with records in _buf
        self._incidents: list[tuple[str, str, float, str]] = []  # under _buf_lock
        self._incident_memo = stored_incidents.Memo()
        self._stacks: dict[tuple[str, int], stored_stacks.Row] = {}  # the newest per rank, too
        self._commands: list[stored_commands.Row] = []  # under _buf_lock
        self._closed = False
        # clock() of the last append per run and rank (this process only): the band frontier
        self._arrival: dict[str, dict[int, float]] = {}
        self._run_first: dict[str, float] = {}
        self._due = band.Schedule()  # runs whose band may move (under _buf_lock)
        self._band_runs = BAND_RUNS
        self._n = {"set_aside_records": 0, "band_errors": 0, "band_runs_skipped": 0}
        self._gate = openbuckets.Gate()
        try:
            create(self._writer, path)
            if not openbuckets.saved(self._writer):  # the last process did not close the store
                script = [
                    "BEGIN TRANSACTION",
                    *openbuckets.recover_sql(),
                    *openbuckets.mark_sql("saved"),
                ]
                rollup.run_script(self._writer, [*script, "COMMIT"])
            self._mirror = Mirror.load(self._writer)
            # the flush's numpy columns are found by name in the frame that made them, also
            # when rollup.run_script executes the statement one frame down: see write.py
            self._writer.execute("SET python_scan_all_frames = true")
        except (duckdb.Error, StoreError) as exc:
            self._con.close()
            reason = exc.reason if isinstance(exc, StoreError) else open_reason(exc)
            raise StoreError(f"cannot read the store at {path}: {exc}", reason) from exc
        self._due.dirty.update(band.needs_look(self._mirror))

    # --- writing ---------------------------------------------------------------------------

    def append(self, records: Sequence[Item]) -> None:
        """Buffer accepted records and ``StepBlock``s (cheap; any thread). They reach disk at
        the next flush(); a block is stored exactly as its ``records()`` would be."""
        self._check_open()
        now = self._clock()
        with self._buf_lock:
            self._buf.extend(records)  # checks the types first
            # Only step records count as arrival for the band: a hung rank goes on sending
            # heartbeats, and must not hold every later step's band back (unsettled steps are
            # banded from raw rows at each query: a chart would grow slower with every step).
            senders = {(rec.run, rec.rank, _has_steps(rec)) for rec in records
                       if type(rec) is not RanksBlock}  # fmt: skip
            buf_ranks = self._buf_ranks
            for rec in records:
                if type(rec) is RanksBlock and len(rec):  # a relay's frame: its ranks stepped
                    buf_ranks.update(zip(repeat(rec.run), rec.ranks))
                    runs = self._arrival.get(rec.run)
                    if runs is None:
                        runs = self._arrival[rec.run] = {}
                        self._run_first[rec.run] = now
                    runs.update(dict.fromkeys(rec.ranks, now))
                    self._due.dirty.add(rec.run)
            for run, rank, stepped in senders:
                buf_ranks.add((run, rank))
                runs = self._arrival.get(run)
                if runs is None:
                    runs = self._arrival[run] = {}
                    self._run_first[run] = now
                if stepped:
                    runs[rank] = now
                self._due.dirty.add(run)

    def append_steps(
        self,
        run: str,
        metric: str,
        rank: np.ndarray,
        step: np.ndarray,
        value: np.ndarray,
        *,
        seq: np.ndarray | None = None,
        time_s: np.ndarray | None = None,
        world_size: int = 1,
    ) -> None:
        """Bulk path (benchmarks, importers): one step record per array element, one metric.

        ``seq`` defaults to ``step + 1`` (a record per step per rank), ``time_s`` to 0.
        """
        self._check_open()
        rank = np.asarray(rank, dtype=np.int32)
        step = np.asarray(step, dtype=np.int64)
        seq = step + 1 if seq is None else np.asarray(seq, dtype=np.int64)
        t = np.zeros(len(step)) if time_s is None else np.asarray(time_s, dtype=np.float64)
        now = self._clock()
        with self._buf_lock:
            self._buf.add_columns(
                run, metric, rank, step, np.asarray(value, np.float64), seq, t, world_size
            )
            self._run_first.setdefault(run, now)
            runs = self._arrival.setdefault(run, {})
            for r in np.unique(rank).tolist():
                runs[r] = now
            self._due.dirty.add(run)

    def append_incident(self, incident: dict[str, Any]) -> None:
        """Keep an incident's latest judgement (``Incident.as_dict()``) at the next flush."""
        self._check_open()
        with self._buf_lock:
            self._incidents.append(stored_incidents.row(incident))

    def append_command(self, command: dict[str, Any]) -> None:
        """Keep a command's latest state (``Issued.as_dict()``) at the next flush."""
        self._check_open()
        with self._buf_lock:
            self._commands.append(stored_commands.row(command))

    def append_stack(self, run: str, rank: int, sample: dict[str, Any]) -> None:
        """Keep ``sample`` (``StackSample.as_dict()``) as the rank's latest stack sample at the
        next flush, unless a newer one is held."""
        self._check_open()
        row = stored_stacks.row(run, rank, sample)
        with self._buf_lock:
            held = self._stacks.get((run, rank))
            if held is None or held[2] <= row[2]:
                self._stacks[(run, rank)] = row

    def pending(self) -> int:
        """Records appended and not flushed yet. Counted outside the lock that ``append``
        (the ingest thread) needs: only the lists are copied under it."""
        held = Batch()
        with self._buf_lock:
            held.records, held.parts = list(self._buf.records), list(self._buf.parts)
        return held.count()

    def buffered_ranks(self) -> int:
        """Ranks with records appended since the last flush began (``append``'s; a good
        guess, not a count under the lock: for when to flush, see ``flusher.flush_due``)."""
        return len(self._buf_ranks)

    def flush(self) -> None:
        """Write everything buffered, then settle the band of the runs that can move on.

        Raises StoreError and keeps the records buffered (up to MAX_BUFFER_ROWS) when the
        disk refuses them. A batch DuckDB refuses otherwise (out of memory: a big backlog
        after an outage) is written in halves, oldest first; a piece that fails alone is set
        aside (see the module docstring), so the records after it are stored."""
        self._check_open()
        with self._flush_lock:
            with self._buf_lock:
                batch, self._buf = self._buf, Batch()
                self._buf_ranks = set()
                notes, self._incidents = self._incidents, []
                stacks, self._stacks = self._stacks, {}
                commands, self._commands = self._commands, []
            if commands:
                try:
                    stored_commands.insert(self._writer, commands)
                except duckdb.Error as exc:
                    with self._buf_lock:
                        self._commands[:0] = commands
                    log.warning("rankwatch: commands not stored yet (%s); retrying", exc)
            if stacks:
                try:
                    stored_stacks.insert(self._writer, list(stacks.values()))
                except duckdb.Error as exc:
                    with self._buf_lock:
                        self._stacks = {**stacks, **self._stacks}
                    log.warning("rankwatch: stack samples not stored yet (%s); retrying", exc)
            if notes:
                try:
                    stored_incidents.insert(self._writer, notes)
                except duckdb.Error as exc:
                    with self._buf_lock:
                        self._incidents[:0] = notes
                    log.warning("rankwatch: incidents not stored yet (%s); retrying", exc)
                self._incident_memo.stored({note[0] for note in notes})  # also part of a batch
            pending = [batch]
            while pending:
                part = pending.pop(0)
                try:
                    self._insert(part)
                except Exception as exc:  # whatever refuses a batch must not stop the next
                    if _disk_refuses(exc):
                        self._fail([part, *pending], exc)
                    halves = part.split()
                    if halves is not None:
                        pending[:0] = halves
                        continue
                    if set_aside(part, self.path.parent, exc) is None:
                        self._fail([part, *pending], exc)
                    self._n["set_aside_records"] += part.count()
            self._settle()

    def _insert(self, batch: Batch) -> None:
        with self._state_lock:
            mirror = self._mirror.copy()

        def commit(script: list[str]) -> None:
            with self._gate.exclusive():
                rollup.run_script(self._writer, [*script, "COMMIT"])
                with self._state_lock:
                    self._mirror = mirror

        write.insert(self._writer, mirror, batch, commit)

    def _fail(self, unwritten: list[Batch], exc: Exception) -> NoReturn:
        """Put what was not written back in front of the buffer, and raise."""
        rest = unwritten[0]
        for later in unwritten[1:]:
            rest.absorb(later, math.inf)
        with self._buf_lock:
            dropped = rest.absorb(self._buf, MAX_BUFFER_ROWS)
            self._buf = rest
        more = f"; {dropped} oldest buffered rows dropped" if dropped else ""
        raise StoreError(f"cannot write to the store at {self.path}: {exc}{more}") from exc

    def _settle(self) -> None:
        """Settle the bands of the runs appended to since their last look and of those due
        (see band.py): one transaction for all of them, at most ``_band_runs`` runs."""
        now = self._clock()
        with self._buf_lock:
            runs = self._due.take(now, self._band_runs)
            arrival = {run: dict(self._arrival.get(run, {})) for run in runs}
        if not runs:
            return
        with self._state_lock:
            mirror = self._mirror.copy()
        limits = band.Limits(BAND_STALE_S, BAND_WAIT_UNSEEN_S, BAND_REPAIR_QUIET_S,
                             BAND_REPAIR_ROWS)  # fmt: skip
        todo = band.plan(mirror, runs, arrival, self._run_first, now, limits)
        if not todo.empty:
            try:
                script = band.sql(self._writer, todo, ["BEGIN TRANSACTION"])
                rollup.run_script(self._writer, [*script, "COMMIT"])
            except duckdb.Error as exc:
                write.rollback(self._writer)
                self._band_failed(runs, exc)
                return
        with self._state_lock:
            self._mirror = mirror
        self._band_runs = min(BAND_RUNS, self._band_runs * 2)
        with self._buf_lock:
            self._due.wake(todo.wake)

    def _band_failed(self, runs: set[str], exc: duckdb.Error) -> None:
        self._n["band_errors"] += 1
        if len(runs) > 1:
            self._band_runs = max(1, len(runs) // 2)
            with self._buf_lock:
                self._due.dirty.update(runs)
            log.warning("rankwatch: the band of %d runs could not be settled (%s); "
                        "retrying %d at a time", len(runs), exc, self._band_runs)  # fmt: skip
            return
        # One run alone: it waits for new records (its charts band it from raw rows meanwhile)
        self._n["band_runs_skipped"] += 1
        log.warning("rankwatch: the band of run %r could not be settled (%s); its charts "
                    "compute it at each query until new records come", next(iter(runs)),
                    exc)  # fmt: skip

    def rebuild_band(self, run: str) -> None:
        """Recompute the band of ``run`` from its raw rows at the next flush (after an import
        that delivered ranks one after the other)."""
        with self._flush_lock:
            with self._state_lock:
                if run in self._mirror.band:
                    for stats in self._mirror.metric_stats(run):
                        self._mirror.late[(run, stats.metric)] = stats.lo
            with self._buf_lock:
                ranks = self._arrival.get(run, {})
                for rank in ranks:
                    ranks[rank] = -math.inf
                self._due.dirty.add(run)
        self.flush()

    def counters(self) -> dict[str, int]:
        """What the store had to set aside: records (in JSONL beside the store), band
        settles that failed, runs whose band was left to the queries."""
        return {f"store_{k}": v for k, v in self._n.items()}

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Flush and close (idempotent). Raises StoreError if the final flush fails. A flush
        still running after ``wait_s`` is interrupted: its records stay buffered and this
        last flush writes them."""
        if self._closed:
            return
        if not self._flush_lock.acquire(timeout=wait_s):
            deadline = time.monotonic() + CLOSE_INTERRUPT_S
            while True:  # asked between two statements, the flush goes on with the next
                self._writer.interrupt()
                if self._flush_lock.acquire(timeout=CLOSE_POLL_S):
                    break
                if time.monotonic() > deadline:
                    raise StoreError(f"cannot close the store at {self.path}: a flush is "
                                     "still running; the records buffered since are not "
                                     "stored (the agents' JSONL has them)")  # fmt: skip
        self._flush_lock.release()
        try:
            self.flush()
            if not self._mirror.opens.saved:
                openbuckets.save(self._writer, self._mirror.opens)
            if self._mirror.seen.logged != len(self._mirror.seen):
                seen.save(self._writer, self._mirror.seen)
        finally:
            self._closed = True
            self._reads.close()
            self._writer.close()
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _disk_refuses(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, _KEEP) or any(mark in text for mark in _KEEP_MARKS)


def _has_steps(item: Item) -> bool:
    return type(item) is StepRecord or (type(item) is StepBlock and len(item) > 0)
