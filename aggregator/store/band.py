"""Settling the cross-rank band: which runs' bands can move on, and the SQL that moves them.

A run's band is settled up to its *frontier* (one below the slowest live rank's latest step):
the band table and its rollups hold those steps; later ones are banded from raw rows at query
time. ``plan`` (pure: the Mirror, arrival times and ``now`` in, a ``Settle`` out) decides per
run what to settle and when looking again is worth it (``wake``); ``sql`` settles every run of
a plan in one fixed set of statements, so a flush touching ten thousand runs costs as many
calls as one touching one. Metrics that received values for settled steps are *repaired*
(their band recomputed from the first late step) in the same statements.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np
from rankwatch.aggregator.store import rollup
from rankwatch.aggregator.store.rows import Mirror

STEP_MIN = -(2**63)  # the lowest int64 step: nothing can be settled below a rank there


@dataclass(frozen=True)
class Limits:
    stale_s: float  # a rank without a step record this long no longer holds back the band
    wait_unseen_s: float  # ranks of world_size never seen hold it back this long
    repair_quiet_s: float  # a run with late rows is re-banded after this long without input
    repair_rows: float  # ... or at once if re-banding reads fewer raw rows than this


@dataclass
class Settle:
    """What one settle does: steps (after, upto] of runs (after None: nothing settled yet),
    and (run, metric, first late step, settled step) repairs; ``wake``: per run looked at, the
    time its band may move without new input (None: only new input moves it)."""

    advance: list[tuple[str, int | None, int]] = field(default_factory=list)
    repair: list[tuple[str, str, int, int]] = field(default_factory=list)
    wake: dict[str, float | None] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.advance and not self.repair


class Schedule:
    """The runs the next settle looks at: those appended to since their last look, and those
    whose ``Settle.wake`` time has come. Not thread-safe (the store holds a lock)."""

    def __init__(self) -> None:
        self.dirty: set[str] = set()
        self._wake: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def take(self, now: float, limit: int) -> set[str]:
        """The runs to look at now, at most ``limit`` (the rest stay for the next settle)."""
        runs, self.dirty = self.dirty, set()
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, run = heapq.heappop(heap)
            if self._wake.get(run) == due:
                del self._wake[run]
                runs.add(run)
        if len(runs) > limit:
            later = sorted(runs)[limit:]
            runs.difference_update(later)
            self.dirty.update(later)
        return runs

    def wake(self, wake: dict[str, float | None]) -> None:
        """After a settle: look again at these times (runs appended to meanwhile are dirty)."""
        for run, due in wake.items():
            if due is not None and run not in self.dirty:
                self._wake[run] = due
                heapq.heappush(self._heap, (due, run))


def frontier(
    mirror: Mirror,
    run: str,
    arrival: dict[int, float],
    now: float,
    first: float | None,
    limits: Limits,
) -> int | None:
    """The last step whose band can be settled: one below the slowest live rank's latest
    step. Ranks that ended, crashed or went silent for ``stale_s`` do not hold it back;
    ranks of world_size never seen do, for ``wait_unseen_s`` after the run's first record.
    With no live rank left, everything is settled. None: nothing to settle yet."""
    rows = list(mirror.ranks.get(run, {}).values())
    world = max((r.world_size or 0 for r in rows), default=0)
    if world > len(rows) and first is not None and now - first < limits.wait_unseen_s:
        return None
    live = [
        r.last_step
        for r in rows
        if r.last_step is not None
        and not r.ended
        and now - arrival.get(r.rank, -math.inf) < limits.stale_s
    ]
    if live:
        slowest = min(live)
        return None if slowest == STEP_MIN else slowest - 1
    return max((r.last_step for r in rows if r.last_step is not None), default=None)


def _wake(
    mirror: Mirror,
    run: str,
    arrival: dict[int, float],
    now: float,
    first: float | None,
    limits: Limits,
    late_waits: bool,
) -> float | None:
    """When time alone may move ``run``'s band: a live rank going stale, the wait for unseen
    ranks ending, a deferred repair's quiet period ending."""
    done, last = mirror.band.get(run), mirror.last_step(run)
    times = []
    if late_waits:
        times.append(max(arrival.values(), default=-math.inf) + limits.repair_quiet_s)
    if last is not None and (done is None or done < last):
        rows = list(mirror.ranks.get(run, {}).values())
        world = max((r.world_size or 0 for r in rows), default=0)
        if world > len(rows) and first is not None and now - first < limits.wait_unseen_s:
            times.append(first + limits.wait_unseen_s)
        for r in rows:
            seen = arrival.get(r.rank, -math.inf)
            if r.last_step is not None and not r.ended and now - seen < limits.stale_s:
                times.append(seen + limits.stale_s)
    return min(times, default=None)


def plan(
    mirror: Mirror,
    runs: Iterable[str],
    arrival: dict[str, dict[int, float]],
    run_first: dict[str, float],
    now: float,
    limits: Limits,
) -> Settle:
    """Decide the settle of ``runs`` and apply it to ``mirror`` (a copy the caller swaps in
    once the statements committed). A repair runs at once if it re-reads fewer than
    ``repair_rows`` raw rows, else once the run has had no input for ``repair_quiet_s``."""
    out = Settle()
    late_by_run: dict[str, dict[str, int]] = {}
    for (run, metric), step in mirror.late.items():
        late_by_run.setdefault(run, {})[metric] = step
    for run in runs:
        done = mirror.band.get(run)
        ranks = arrival.get(run, {})
        quiet = now - max(ranks.values(), default=-math.inf) >= limits.repair_quiet_s
        waiting = False
        for metric, step in late_by_run.get(run, {}).items():
            if done is None:  # late only exists below a settled step
                del mirror.late[(run, metric)]
                continue
            stats = mirror.stats.get((run, metric))
            span = stats.hi - stats.lo + 1 if stats else 1
            redo = (stats.rows if stats else 0) * (done - step + 1) / span
            if quiet or redo <= limits.repair_rows:
                out.repair.append((run, metric, step, done))
                del mirror.late[(run, metric)]
            else:
                waiting = True
        first = run_first.get(run)
        upto = frontier(mirror, run, ranks, now, first, limits)
        if upto is not None and (done is None or upto > done):
            out.advance.append((run, done, upto))
            mirror.band[run] = upto
        out.wake[run] = _wake(mirror, run, ranks, now, first, limits, waiting)
    return out


def needs_look(mirror: Mirror) -> list[str]:
    """Runs a store opened with must settle: unsettled steps or repairs left by the last
    process (its arrival times are gone, so their ranks count as silent)."""
    late = {run for run, _ in mirror.late}
    out = []
    for run in mirror.ranks:
        done, last = mirror.band.get(run), mirror.last_step(run)
        if run in late or (last is not None and (done is None or done < last)):
            out.append(run)
    return out


def sql(cur: duckdb.DuckDBPyConnection, todo: Settle, script: Sequence[str] = ()) -> list[str]:
    """Statements settling ``todo`` (run on the writer cursor inside the caller's transaction:
    the band rows, their rollups and ``band_done`` together). ``script``: the caller's
    statements not run yet; returns those left (see ``rollup.fold``)."""
    adv, rep = todo.advance, todo.repair
    # Found by name by DuckDB (a replacement scan) while rollup.fold runs the first statements
    rw_adv_np = {
        "run": np.array([a[0] for a in adv], dtype=object),
        "settled": np.array([a[1] is not None for a in adv], dtype=bool),
        "after": np.array([0 if a[1] is None else a[1] for a in adv], dtype=np.int64),
        "upto": np.array([a[2] for a in adv], dtype=np.int64),
    }
    rw_rep_np = {
        "run": np.array([r[0] for r in rep], dtype=object),
        "metric": np.array([r[1] for r in rep], dtype=object),
        "step": np.array([r[2] for r in rep], dtype=np.int64),
        "done": np.array([r[3] for r in rep], dtype=np.int64),
    }
    coarsest = rollup.LEVELS[-1]
    tables = [
        "CREATE OR REPLACE TEMP TABLE rw_adv AS SELECT CAST(run AS VARCHAR) AS run, settled, "
        "after, upto FROM rw_adv_np",
        "CREATE OR REPLACE TEMP TABLE rw_rep AS SELECT CAST(run AS VARCHAR) AS run, "
        f"CAST(metric AS VARCHAR) AS metric, step, done, step - (step % {coarsest} + "
        f"{coarsest}) % {coarsest} AS start FROM rw_rep_np",
    ]
    match = "t.run = r.run AND t.metric = r.metric"
    clear = []
    if rep:  # a repair re-folds from the start of the coarsest bucket holding its late step
        clear = [
            *(f"DELETE FROM {rollup.table('band', w, o)} t USING rw_rep r WHERE {match} AND "
              f"t.b >= r.start // {w}" for w in rollup.LEVELS for o in (False, True)),
            f"DELETE FROM band t USING rw_rep r WHERE {match} AND t.step >= r.step",
            f"DELETE FROM band_late t USING rw_rep r WHERE {match}",
        ]  # fmt: skip
    bounds = ""
    if adv:  # constant bounds DuckDB can check against each row group's step range
        hi = max(a[2] for a in adv)
        bounds = f" AND s.step <= {hi}"
        if all(a[1] is not None for a in adv):
            bounds += f" AND s.step > {min(a[1] for a in adv if a[1] is not None)}"
    source = (
        "SELECT s.run, s.metric, s.step, s.value FROM steps s JOIN rw_adv a ON s.run = a.run "
        f"WHERE (NOT a.settled OR s.step > a.after) AND s.step <= a.upto{bounds} "
        "UNION ALL SELECT s.run, s.metric, s.step, s.value FROM steps s JOIN rw_rep r "
        "ON s.run = r.run AND s.metric = r.metric WHERE s.step >= r.step AND s.step <= r.done"
    )
    script = [
        *script,
        *tables,
        *clear,
        "CREATE OR REPLACE TEMP TABLE rw_band AS " + rollup.band_wide_sql("true", source),
        "INSERT INTO band SELECT * FROM rw_band",
        # new rows, and for a repair every band row from its bucket's start
        "CREATE OR REPLACE TEMP TABLE rw_fold AS SELECT b.* FROM rw_band b ANTI JOIN rw_rep r "
        "ON b.run = r.run AND b.metric = r.metric AND b.step <= r.done UNION ALL "
        f"SELECT t.* FROM band t JOIN rw_rep r ON {match} AND t.step >= r.start "
        "AND t.step <= r.done",
        "DELETE FROM band_done t USING rw_adv a WHERE t.run = a.run",
        "INSERT INTO band_done SELECT run, upto FROM rw_adv",
    ]
    script = rollup.fold(cur, "band", rollup.band_part_sql("rw_fold", rollup.LEVELS[0]), script)
    del rw_adv_np, rw_rep_np
    return script
