"""Rank restarts: a new incarnation of a known (run, rank) becomes a ``restart`` event.

Pure: accepted step records in, events out; no clock, no store. An incarnation (``inc`` in
``agent/wire/records.py``) is one process's sequence of seqs. The newest incarnation of a rank is
the one whose steps came last in record time, so an import of an earlier process's history
(older times) neither counts as a restart nor takes the place of the live one.

The event is the aggregator's own (``records.AGGREGATOR_EVENTS``): seq 0, so it never takes a
seq of the agent's; its ``info`` names the previous and the new incarnation and their last and
first step (previous ones None when only the store knew the earlier incarnation).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from rankwatch.agent.wire.records import EventRecord, RanksBlock, StepBlock, StepRecord

RESTART = "restart"


@dataclass(slots=True)
class _Life:
    inc: int
    step: int  # the last step seen from it
    time: float  # its record time


class Restarts:
    """The newest incarnation of every (run, rank) that logged steps; see the module docstring."""

    def __init__(self) -> None:
        # kept when a run retires from the live state, as the seq tracker keeps its seqs
        self._latest: dict[tuple[str, int], _Life] = {}
        self.restarts = 0  # restart events made
        self.version = 0  # counts the changes of any rank's newest incarnation (``current``)

    def current(self, run: str, rank: int) -> int:
        """The newest incarnation of ``(run, rank)`` (0: none seen, or an agent without one)."""
        life = self._latest.get((run, rank))
        return 0 if life is None else life.inc

    def seen(self, run: str, rank: int) -> bool:
        """Has ``(run, rank)`` logged steps here before?"""
        return (run, rank) in self._latest

    def continues(self, block: RanksBlock) -> bool:
        """When every rank of ``block`` goes on in its newest incarnation (no restart, no
        new rank): take the block as ``observe`` takes each record, and True; else False,
        and nothing taken."""
        latest = self._latest
        run = block.run
        lives = [latest.get((run, rank)) for rank in block.ranks]
        for life, inc in zip(lives, block.incs, strict=True):
            if life is None or life.inc != inc:
                return False
        for life, step, time in zip(lives, block.step, block.time, strict=True):
            if time >= life.time:  # type: ignore[union-attr]  # none is None: checked above
                life.step, life.time = step, time  # type: ignore[union-attr]
        return True

    def observe(
        self, item: StepRecord | StepBlock, stored: Collection[int] = ()
    ) -> EventRecord | None:
        """Take accepted step records (one rank and incarnation); a ``restart`` event when
        they start a newer incarnation. ``stored``: other incarnations of the rank the store
        held before this process saw any step of it (asked only for a rank's first step)."""
        if type(item) is StepBlock:
            first_step, first_time = item.step[0], item.time[0]
            last_step, last_time = item.step[-1], item.time[-1]
        else:
            first_step = last_step = item.step
            first_time = last_time = item.time
        key = (item.run, item.rank)
        life = self._latest.get(key)
        if life is not None and life.inc == item.inc:
            if last_time >= life.time:
                life.step, life.time = last_step, last_time
            return None
        if life is not None and first_time < life.time:
            return None  # an earlier process's records, arriving late (an import, a resend)
        self._latest[key] = _Life(item.inc, last_step, last_time)
        self.version += 1
        if life is None and not stored:
            return None  # the rank's first incarnation
        self.restarts += 1
        previous = (life.inc, life.step) if life is not None else (_only(stored), None)
        info = {
            "previous_inc": previous[0], "previous_step": previous[1],
            "inc": item.inc, "step": first_step,
        }  # fmt: skip
        return EventRecord(
            item.run, item.rank, 0, first_time, item.world_size, item.host, item.pid, RESTART,
            first_step, info, item.inc,
        )  # fmt: skip


def _only(incs: Collection[int]) -> int | None:
    return next(iter(incs)) if len(incs) == 1 else None
