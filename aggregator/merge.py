"""Merge the ranks' records: group metric values by (run, metric, step).

Pure: no sockets, no clock. ``now`` is the aggregator's clock, passed in by the caller.
Duplicates are dropped before, by ``seqs.SeqTracker``.

``StepMerger`` collects the value every rank logged for a (run, metric, step). A group is handed
out by ``add()`` the moment all ``world_size`` ranks have reported that metric at that step; groups
that never fill (a rank is slow, lost, or only some ranks log that metric) are handed out partial
by ``expire()`` once ``grace_s`` has passed since their first value. Values that arrive for a
(run, metric, step) already handed out are counted in ``late`` and not scored (the store still
keeps them: the merger only feeds the cross-rank scoring).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from rankwatch.agent.wire.records import RanksBlock, StepBlock, StepRecord

DEFAULT_GRACE_S = 5.0  # wait this long for the slowest rank before scoring a partial step
MAX_STEP_WINDOW = 1_000  # steps older than the newest by more than this are closed at once
MAX_OPEN_STEPS = 4_096  # open (run, step) groups per run, whatever their step numbers
CLOSED_MEMORY = 4_096  # recently closed steps remembered per run to tell late records apart
MAX_NAME_SETS = 1_024  # metric-name tuples shared between ranks' block rows (a cache)


__all__ = ["StepGrid", "StepMerger", "StepValues"]


@dataclass(frozen=True)
class StepValues:
    """The values of one metric at one step across the ranks that reported it."""

    run: str
    metric: str
    step: int
    values: dict[int, float]  # rank -> value (NaN and ±Inf kept)
    world_size: int
    complete: bool  # every rank in 0..world_size-1 reported


# a step every rank reported the same metrics at: names, ranks, rows, world size, complete
_Completed = tuple[tuple[str, ...], list[int], list[tuple[float, ...]], int, bool]


@dataclass
class StepGrid:
    """Consecutive completed steps of one run where every rank reported the same metrics, as
    a grid (what a round of batched frames completes at once): ``rows[i][k][j]`` is metric
    ``names[j]`` of rank ``ranks[k]`` at ``steps[i]``. ``step_values()`` gives the StepValues
    ``add`` would have handed out, in the same order (step by step, metric by metric)."""

    run: str
    names: tuple[str, ...]
    ranks: list[int]  # the order every step's ranks reported in
    steps: list[int]
    rows: list[list[tuple[float, ...]]]
    world_size: int
    complete: bool

    def takes(self, done: _Completed) -> bool:
        names, ranks, _, world_size, complete = done
        return (
            names == self.names
            and world_size == self.world_size
            and complete == self.complete
            and ranks == self.ranks
        )

    def step_values(self) -> list[StepValues]:
        run, ranks, ws, full = self.run, self.ranks, self.world_size, self.complete
        return [
            _step_values(run, metric, step, dict(zip(ranks, column, strict=True)), ws, full)
            for step, rows in zip(self.steps, self.rows, strict=True)
            for metric, column in zip(self.names, zip(*rows, strict=True), strict=True)
        ]


class _Group:
    __slots__ = ("created", "done", "rows", "step", "values", "world_size")

    def __init__(self, step: int, world_size: int, created: float) -> None:
        self.step = step
        self.world_size = world_size
        self.created = created
        self.values: dict[str, dict[int, float]] = {}
        self.done: set[str] = set()  # metrics already handed out
        # Rows of blocks, kept whole until the step completes: rank -> (names, values). One
        # dict write per rank and step instead of one per metric; turned into ``values``
        # (``spread``) as soon as anything but a fresh row of a new rank arrives.
        self.rows: dict[int, tuple[tuple[str, ...], tuple[float, ...]]] | None = None

    def spread(self) -> None:
        """Move the block rows into ``values``, as if their records had been added in turn."""
        rows, self.rows = self.rows, None
        values = self.values
        for rank, (names, row) in (rows or {}).items():
            for metric, value in zip(names, row, strict=True):
                per_rank = values.get(metric)
                if per_rank is None:
                    per_rank = values[metric] = {}
                per_rank[rank] = value


class _Run:
    __slots__ = ("closed", "floor", "groups", "newest")

    def __init__(self) -> None:
        # Both are queues: added at the end, removed from the front. A dict's first key is
        # found by skipping the slots of keys deleted before it, a cost that grows with the
        # steps remembered (docs/benchmarks.md, Ingest); OrderedDict finds it
        # at once.
        self.groups: OrderedDict[int, _Group] = OrderedDict()  # in creation order
        self.closed: OrderedDict[int, None] = OrderedDict()  # recently closed, oldest first
        self.floor: int | None = None  # steps <= floor are closed (forgotten from `closed`)
        self.newest: int | None = None


class StepMerger:
    """Groups per-rank step records into per-(run, metric, step) cross-rank values."""

    def __init__(
        self,
        grace_s: float = DEFAULT_GRACE_S,
        *,
        max_step_window: int = MAX_STEP_WINDOW,
        max_open_steps: int = MAX_OPEN_STEPS,
    ) -> None:
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        if max_step_window < 1 or max_open_steps < 1:
            raise ValueError("max_step_window and max_open_steps must be >= 1")
        self.grace_s = grace_s
        self.max_step_window = max_step_window
        self.max_open_steps = max_open_steps
        self._runs: dict[str, _Run] = {}
        # closed early by the caps, handed out by expire()
        self._evicted: list[StepValues | StepGrid] = []
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}  # metric-name sets seen
        self.late = 0  # values that arrived after their (run, metric, step) was handed out
        # groups closed incomplete before grace because of the memory caps (a complete group
        # stays open to tell late duplicates apart; the caps retiring it loses nothing)
        self.evicted = 0

    def add(self, rec: StepRecord, now: float) -> list[StepValues]:
        """Add one rank's step record; returns the (run, metric, step) groups it completed."""
        run = self._runs.get(rec.run)
        if run is None:
            run = self._runs[rec.run] = _Run()
        step = rec.step
        group = run.groups.get(step)
        if group is None:
            if step in run.closed or (run.floor is not None and step <= run.floor):
                self.late += len(rec.metrics)
                return []
            group = self._open(rec.run, run, step, rec.world_size, now)
        if group.rows is not None:
            group.spread()
        return self._add_values(rec.run, group, rec.rank, rec.metrics.keys(), rec.metrics.values())

    def add_block(self, block: StepBlock, now: float) -> list[StepValues | StepGrid]:
        """``add`` for each record of ``block``, in order; returns the groups they completed,
        in completion order. Steps where every rank reported the same metrics come as
        ``StepGrid``s (``StepGrid.step_values()``: the same StepValues, in the same order)."""
        return self._add_rows(block, repeat(block.rank), self._run(block.run), now)

    def add_ranks(self, block: RanksBlock, now: float) -> list[StepValues | StepGrid]:
        """``add`` for each record of ``block`` (one per rank), in order; returns what
        ``add_block`` would. The usual block (every record at one step that stays open,
        none of its ranks there yet) is taken in one dict update."""
        name = block.run
        run = self._run(name)
        steps = block.step
        step, n = steps[0], len(steps)
        if steps.count(step) != n:
            return self._add_rows(block, block.ranks, run, now)
        group = run.groups.get(step)
        if group is None:
            if step in run.closed or (run.floor is not None and step <= run.floor):
                self.late += len(block.metrics) * n
                return []
            group = self._open(name, run, step, block.world_size, now)
        held = group.rows
        if held is None and not group.values and not group.done:
            held = group.rows = {}
        if (
            held is None
            or len(held) + n > group.world_size
            or not held.keys().isdisjoint(block.ranks)
        ):
            return self._add_rows(block, block.ranks, run, now)
        names = self._shared(tuple(block.metrics))
        rows = zip(*block.metrics.values(), strict=True) if names else [()] * n
        held.update(zip(block.ranks, zip(repeat(names), rows), strict=False))
        if len(held) < group.world_size:
            return []
        done = self._complete_rows(name, group)
        if isinstance(done, list):
            return list(done)
        names_, order, values, ws, full = done
        return [StepGrid(name, names_, order, [step], [values], ws, full)] if names_ else []

    def _run(self, name: str) -> _Run:
        run = self._runs.get(name)
        if run is None:
            run = self._runs[name] = _Run()
        return run

    def _shared(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Every rank's rows of a step share one names tuple: _complete_rows compares
        identity."""
        shared = self._names.get(names)
        if shared is None:
            if len(self._names) >= MAX_NAME_SETS:
                self._names.clear()
            shared = self._names[names] = names
        return shared

    def _add_rows(
        self, block: StepBlock | RanksBlock, ranks: Iterable[int], run: _Run, now: float
    ) -> list[StepValues | StepGrid]:
        """The records of ``block`` one by one (their ranks in ``ranks``)."""
        name, groups, world_size = block.run, run.groups, block.world_size
        names = self._shared(tuple(block.metrics))
        # a metric-less record still opens its step's group, as ``add`` does
        rows = zip(*block.metrics.values(), strict=True) if names else [()] * len(block)
        out: list[StepValues | StepGrid] = []
        grid: StepGrid | None = None
        for step, rank, row in zip(block.step, ranks, rows, strict=False):  # ranks may repeat
            group = groups.get(step)
            if group is None:
                if step in run.closed or (run.floor is not None and step <= run.floor):
                    self.late += len(names)
                    continue
                group = self._open(name, run, step, world_size, now)
            held = group.rows
            if held is None and not group.values and not group.done:
                held = group.rows = {}
            if held is not None and rank not in held:
                held[rank] = (names, row)
                if len(held) < group.world_size:
                    continue
                done = self._complete_rows(name, group)
                if isinstance(done, list):
                    out += done
                    grid = None
                elif grid is not None and grid.takes(done):
                    grid.steps.append(step)
                    grid.rows.append(done[2])
                elif done[0]:  # metrics to hand out
                    names_, order, values, ws, full = done
                    grid = StepGrid(name, names_, order, [step], [values], ws, full)
                    out.append(grid)
                continue
            if held is not None:
                group.spread()
            grid = None
            out += self._add_values(name, group, rank, names, row)
        return out

    def _complete_rows(self, name: str, group: _Group) -> list[StepValues] | _Completed:
        """Every rank has a row: hand out the metrics every rank reported, in the order the
        last record would have completed them, and keep the rest as values. When every rank
        reported the same metrics (the usual case): (names, ranks, their rows, world size,
        complete), for a StepGrid."""
        rows = group.rows
        assert rows is not None
        step, need = group.step, group.world_size
        entries = list(rows.values())
        last = _shared_names(entries)
        if last is not None:
            group.rows = None
            group.done.update(last)
            return last, list(rows), [row for _, row in entries], need, _full(rows, need)
        group.spread()
        out = []
        for metric in entries[-1][0]:
            per_rank = group.values[metric]
            if len(per_rank) >= need:
                del group.values[metric]
                group.done.add(metric)
                out.append(StepValues(name, metric, step, per_rank, need, _full(per_rank, need)))
        return out

    def _add_values(
        self, name: str, group: _Group, rank: int, names: Iterable[str], row: Iterable[float]
    ) -> list[StepValues]:
        """One rank's values for one step, metric by metric (the general path)."""
        out = []
        need, values = group.world_size, group.values
        for metric, value in zip(names, row, strict=True):
            per_rank = values.get(metric)
            if per_rank is None:
                if metric in group.done:
                    self.late += 1
                    continue
                per_rank = values[metric] = {}
            per_rank[rank] = value
            if len(per_rank) >= need:
                del values[metric]
                group.done.add(metric)
                out.append(
                    StepValues(name, metric, group.step, per_rank, need, _full(per_rank, need))
                )
        return out

    def expire(self, now: float, ranks: int | None = None) -> list[StepValues | StepGrid]:
        """Hand out, partial, every group whose first value is older than ``grace_s`` (a step
        whose ranks all sent the same metrics in blocks as a one-step ``StepGrid``); with
        ``ranks``, only the oldest of them until their world sizes add up to that many (one at
        least), the rest at the next call. Groups evicted for the memory bounds come first,
        all of them."""
        out, self._evicted = self._evicted, []
        deadline = now - self.grace_s
        budget = max(1, ranks) if ranks is not None else -1  # -1: no budget
        for name, run in self._runs.items():
            groups = run.groups
            while groups:
                step, group = next(iter(groups.items()))
                if group.created > deadline:
                    break  # groups are in creation order: the rest are younger
                if budget == 0:
                    return out
                out.extend(self._close(name, run, step))
                if budget > 0:
                    budget = max(0, budget - max(1, group.world_size))
        return out

    def open_groups(self) -> int:
        return sum(len(r.groups) for r in self._runs.values())

    def forget(self, run: str) -> None:
        """Drop all state of ``run`` (e.g. relaunched under the same name with steps from 0)."""
        self._runs.pop(run, None)

    def _open(self, name: str, run: _Run, step: int, world_size: int, now: float) -> _Group:
        group = run.groups[step] = _Group(step, world_size, now)
        if run.newest is None or step > run.newest:
            run.newest = step
        # Memory bound: a rank that died mid-run must not keep thousands of groups open.
        groups = run.groups
        while len(groups) > self.max_open_steps:
            self._evict(name, run, next(iter(groups)))
        oldest_allowed = run.newest - self.max_step_window
        while groups:
            first = next(iter(groups))
            if first >= oldest_allowed or first == step:
                break
            self._evict(name, run, first)
        return group

    def _evict(self, name: str, run: _Run, step: int) -> None:
        partial = self._close(name, run, step)
        if partial:
            self.evicted += 1
            self._evicted.extend(partial)

    def _close(self, name: str, run: _Run, step: int) -> list[StepValues | StepGrid]:
        group = run.groups.pop(step)
        grid = None
        if group.rows is not None:
            grid = _partial_grid(name, group)
            if grid is None:
                group.spread()
        run.closed[step] = None
        if len(run.closed) > CLOSED_MEMORY:
            forgotten, _ = run.closed.popitem(last=False)
            run.floor = forgotten if run.floor is None else max(run.floor, forgotten)
        if grid is not None:
            return [grid] if grid.names and grid.ranks else []
        if not group.values:  # handed out whole (a complete step stays open for late records)
            return []
        ws = group.world_size
        return [
            StepValues(name, metric, step, per_rank, ws, _full(per_rank, ws))
            for metric, per_rank in group.values.items()
        ]


def _shared_names(
    entries: list[tuple[tuple[str, ...], tuple[float, ...]]],
) -> tuple[str, ...] | None:
    """The metric names every one of a step's block rows has (usually one shared tuple:
    ``_shared`` makes equal ones the same), else None. ``entries``: not empty."""
    last = entries[-1][0]
    for names, _ in entries:
        if names is not last and names != last:
            return None
    return last


def _partial_grid(name: str, group: _Group) -> StepGrid | None:
    """A step handed out partial while its block rows are whole, as a one-step grid, when every
    rank reported the same metrics (the usual case): the detector takes the rows as one array,
    where spreading them into a dict per metric cost as much as scoring them (100,000 ranks)."""
    rows = group.rows
    assert rows is not None
    entries = list(rows.values())
    if not entries:
        return StepGrid(name, (), [], [group.step], [[]], group.world_size, False)
    last = _shared_names(entries)
    if last is None:
        return None
    ws = group.world_size
    return StepGrid(name, last, list(rows), [group.step], [[r for _, r in entries]], ws,
                    _full(rows, ws))  # fmt: skip


def _step_values(
    run: str, metric: str, step: int, values: dict[int, float], world_size: int, complete: bool
) -> StepValues:
    """``StepValues(...)`` without the frozen ``__init__``'s six ``object.__setattr__`` calls
    (one per metric and step on the ingest path)."""
    sv = object.__new__(StepValues)
    sv.__dict__.update(
        run=run, metric=metric, step=step, values=values, world_size=world_size, complete=complete
    )
    return sv


def _full(per_rank: dict[int, Any], world_size: int) -> bool:
    # Ranks outside 0..world_size-1 (a misconfigured launcher) do not make a group complete.
    # (min/max: two C loops instead of a generator, once per group on the ingest path.)
    if len(per_rank) < world_size:
        return False
    return not per_rank or (min(per_rank) >= 0 and max(per_rank) < world_size)
