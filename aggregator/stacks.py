"""Stack samples on their way from heartbeats to the incident tracker, the store and the API.

The service hands every accepted heartbeat that carries a ``stack`` to ``take`` (ingest
thread); ``drain`` (the tick) returns what came since the last tick for
``IncidentTracker.observe(stacks=...)`` and gives each rank's newest to the store, which keeps
the latest sample per rank (``store/stacks.py``). A tick holds at most one sample per rank (a
newer one replaces it: ``superseded``) and at most ``per_tick`` ranks (more are ``dropped``
for the tracker; the store still gets every rank's newest). A heartbeat whose ``stack`` the
wire decoder refused or cut is counted by that reason (``refused``, ``truncated``); the
heartbeat itself is never lost.

``latest(run, stored)`` is what ``GET /api/run/stacks`` shows: the store's samples with the
ones this process received laid over them (not flushed yet, or newer).
"""

from __future__ import annotations

import threading
from typing import Any, TypedDict

from rankwatch.agent.wire.records import Heartbeat
from rankwatch.aggregator.incidents.stacks import (
    StackSample,
    group_stacks,
    odd_ones_out,
    render_stacks,
    summary_line,
)

MAX_STACKS_PER_TICK = 8192  # samples fed to the tracker per tick (one per rank)
MAX_LIVE_RUNS = 256  # runs whose latest samples are held in memory for reads

__all__ = ["MAX_STACKS_PER_TICK", "StackIntake", "StackView", "stack_view"]


class StackView(TypedDict):
    """``GET /api/run/stacks``: each rank's latest sample, grouped by signature."""

    run: str
    samples: list[dict[str, Any]]  # the wire form with "rank", by rank
    groups: list[dict[str, Any]]  # signature, where, ranks, label; the largest first
    odd_ones_out: list[int]  # ranks outside the framework while the others wait in it
    summary: str  # "3 ranks (0, 1, 3) in mindspore/.../grad_reducer.py AllReduce; rank 2 in ..."
    text: str  # what `rankwatch stacks` prints
    unreadable: int  # stored samples that no longer read as one (skipped)


class StackIntake:
    def __init__(self, per_tick: int = MAX_STACKS_PER_TICK) -> None:
        self.per_tick = per_tick
        self._tick: dict[tuple[str, int], StackSample] = {}  # for the tracker
        self._unstored: dict[tuple[str, int], StackSample] = {}  # for the store
        self._latest: dict[str, dict[int, dict[str, Any]]] = {}  # for reads
        self._lock = threading.Lock()
        self.n = {"received": 0, "superseded": 0, "dropped": 0, "refused": 0, "truncated": 0}

    def take(self, hb: Heartbeat) -> None:
        """One accepted heartbeat's stack sample, and what the decoder said of it."""
        if hb.stack_problem:
            reason = hb.stack_problem.partition(":")[0]
            self.n[reason if reason == "truncated" else "refused"] += 1
        w = hb.stack
        if w is None:
            return
        self.n["received"] += 1
        sample = StackSample(
            hb.run, hb.rank, w.time, w.step, w.where, w.signature, w.frames, w.stalled_s, w.note
        )
        key = (hb.run, hb.rank)
        self._unstored[key] = sample
        if key in self._tick:
            self.n["superseded"] += 1
            self._tick[key] = sample
        elif len(self._tick) < self.per_tick:
            self._tick[key] = sample
        else:
            self.n["dropped"] += 1
        with self._lock:
            runs = self._latest
            if hb.run not in runs and len(runs) >= MAX_LIVE_RUNS:
                del runs[next(iter(runs))]  # the run that stalled first: the store has it
            runs.setdefault(hb.run, {})[hb.rank] = w.as_dict()

    def drain(self, store: Any) -> list[StackSample]:
        """This tick's samples for the tracker; every rank's newest goes to
        ``store.append_stack``."""
        samples = list(self._tick.values())
        unstored, self._tick, self._unstored = self._unstored, {}, {}
        for s in unstored.values():
            try:
                store.append_stack(s.run, s.rank, as_wire(s))
            except Exception:  # the store is closing: the tracker still gets them
                break
        return samples

    def latest(self, run: str, stored: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Rank -> the newest sample known of ``run``: ``stored`` (the store's) with the ones
        received by this process laid over it."""
        with self._lock:
            live = dict(self._latest.get(run, {}))
        out = dict(stored)
        for rank, sample in live.items():
            if rank not in out or out[rank].get("time", 0.0) <= sample.get("time", 0.0):
                out[rank] = sample
        return out

    def counters(self) -> dict[str, int]:
        return {f"stacks_{k}": v for k, v in self.n.items()}


def as_wire(s: StackSample) -> dict[str, Any]:
    return {
        "where": s.where, "signature": s.signature, "step": s.step, "time": s.time,
        "stalled_s": s.stalled_s, "note": s.note,
        "frames": [[f.file, f.line, f.function] for f in s.frames],
    }  # fmt: skip


def stack_view(run: str, latest: dict[int, dict[str, Any]]) -> StackView:
    """What the API answers for ``run`` from rank -> latest sample (the wire form)."""
    samples: list[StackSample] = []
    unreadable = 0
    for rank in sorted(latest):
        try:
            samples.append(StackSample.from_dict(run, rank, latest[rank]))
        except ValueError:
            unreadable += 1
    groups = group_stacks(samples)
    return {
        "run": run,
        "samples": [{"rank": s.rank, **as_wire(s)} for s in samples],
        "groups": [
            {"signature": g.signature, "where": g.where, "ranks": list(g.ranks), "label": g.label}
            for g in groups
        ],
        "odd_ones_out": list(odd_ones_out(groups)),
        "summary": summary_line(groups),
        "text": render_stacks(run, groups),
        "unreadable": unreadable,
    }
