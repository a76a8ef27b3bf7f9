"""What of an accepted batch the health tracker observes: the newest step record of each rank,
and, when an event or heartbeat of that rank follows it in the batch, that record first.

Pure. Health only needs a rank's newest step of a batch (``HealthTracker.observe``); a
``RanksBlock``'s records are held as (block, row), not made into records, and the rows still
newest at the end are observed block by block (``HealthTracker.observe_ranks``).
"""

from __future__ import annotations

from itertools import repeat

from rankwatch.agent.wire.records import RanksBlock, Record, StepRecord
from rankwatch.aggregator.health import HealthTracker

Held = StepRecord | tuple[RanksBlock, int]


class Newest:
    """One batch's newest step record per (run, rank)."""

    __slots__ = ("_blocks", "_dropped", "_held")

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], Held] = {}
        self._blocks: list[RanksBlock] = []
        self._dropped: dict[int, set[int]] = {}  # id(block) -> its rows no longer newest

    def step(self, key: tuple[str, int], rec: StepRecord) -> None:
        if self._blocks:  # it may take a block's row's place
            self._drop(self._held.get(key))
        self._held[key] = rec

    def block(self, block: RanksBlock) -> None:
        held = self._held
        keys = list(zip(repeat(block.run), block.ranks))
        if held and not held.keys().isdisjoint(keys):  # a rank's earlier step in this batch
            for key in keys:
                self._drop(held.get(key))
        held.update(zip(keys, zip(repeat(block), range(len(block))), strict=True))
        self._blocks.append(block)

    def pop(self, key: tuple[str, int]) -> Held | None:
        """The rank's held step, which must be observed before its next record, if any."""
        out = self._held.pop(key, None)
        self._drop(out)
        return out

    def observe(self, health: HealthTracker, now: float) -> None:
        """Observe every step still held."""
        for held in self._held.values():
            if type(held) is StepRecord:
                health.observe(held, now)
        dropped = self._dropped
        for block in self._blocks:
            gone = dropped.get(id(block))
            rows = None if gone is None else sorted(set(range(len(block))) - gone)
            health.observe_ranks(block, rows, now)

    def _drop(self, held: Held | None) -> None:
        if type(held) is tuple:
            block, i = held
            self._dropped.setdefault(id(block), set()).add(i)


def observe_held(health: HealthTracker, held: Held | Record, now: float) -> None:
    """Observe one held step (or any record)."""
    if type(held) is tuple:
        health.observe_ranks(held[0], (held[1],), now)
    else:
        health.observe(held, now)  # type: ignore[arg-type]  # a record, not a tuple


def latest_values(values: dict[tuple[str, int], dict[str, float]], block: RanksBlock) -> None:
    """Each rank's latest values (the service's ``values``), from a RanksBlock."""
    run = block.run
    names = tuple(block.metrics)
    rows = zip(*block.metrics.values(), strict=True) if names else repeat(())
    for rank, row in zip(block.ranks, rows, strict=False):
        last = values.get((run, rank))
        if last is None:
            values[(run, rank)] = dict(zip(names, row, strict=True))
        else:
            last.update(zip(names, row, strict=True))
