"""The store's write buffer: accepted records and blocks waiting for the next flush, kept as
they came and turned into numpy columns in bulk by the flush (``parts.py``). Only the store
uses it (``Batch``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rankwatch.agent.wire.records import (
    EventRecord,
    Heartbeat,
    RanksBlock,
    StepBlock,
    StepRecord,
    TelemetryRecord,
)
from rankwatch.aggregator.store.parts import Item, Part, record_part
from rankwatch.aggregator.store.rows import DTYPE, LAYOUT, NULL_CODE, NULL_INT


class Batch:
    """Records and step blocks waiting for the next flush, plus whole numpy parts (bulk
    appends, or a batch handed back by a failed flush). Items are kept as they came (an append
    is a list extend) and turned into columns in bulk by the flush, cheaper per record."""

    def __init__(self) -> None:
        self.records: list[Item] = []
        self.parts: list[Part] = []

    @property
    def empty(self) -> bool:
        return not self.records and not self.parts

    def count(self) -> int:
        """Records held (a block counts as its records)."""
        held = sum(len(i) if type(i) is StepBlock or type(i) is RanksBlock else 1
                   for i in self.records)  # fmt: skip
        return held + sum(int(p.tables["recs"]["n"].sum()) for p in self.parts)

    def extend(self, items: Sequence[Item]) -> None:
        for item in items:
            if isinstance(item, StepBlock):
                _check_block(item)
            elif type(item) is RanksBlock:
                item.check()
            elif not isinstance(item, (StepRecord, EventRecord, Heartbeat, TelemetryRecord)):
                raise TypeError(
                    f"Store.append takes records, got {type(item).__name__} "
                    "(expected StepRecord, EventRecord, Heartbeat, TelemetryRecord or StepBlock)"
                )
        self.records.extend(items)

    def add_columns(
        self, run: str, metric: str, rank: np.ndarray, step: np.ndarray, value: np.ndarray,
        seq: np.ndarray, t: np.ndarray, world_size: int,
    ) -> None:  # fmt: skip
        n = len(step)
        names = [run, metric, "step", ""]  # codes 0..3
        code = {i: np.full(n, i, np.int32) for i in range(4)}
        none = np.full(n, NULL_INT, dtype=np.int64)
        steps = (code[0], rank, seq, step, none, t, code[1], value, np.zeros(n, np.int64))
        recs = (code[0], rank, seq, t, code[2], np.full(n, world_size, np.int64), code[3],
                np.zeros(n, np.int64), step, np.full(n, NULL_CODE, np.int32), seq,
                np.ones(n, np.int64), t, np.zeros(n, np.int64))  # fmt: skip
        part = Part.empty()
        part.names = names
        for name, cols in (("steps", steps), ("recs", recs)):
            part.tables[name] = {
                c: np.asarray(v, DTYPE[k]) for (c, k), v in zip(LAYOUT[name], cols, strict=True)
            }
        self.parts.append(part)

    def as_parts(self) -> list[Part]:
        if not self.records:
            return list(self.parts)
        return [*self.parts, record_part(self.records)]

    def to_numpy(self) -> Part:
        return Part.merge(self.as_parts() or [Part.empty()])

    def split(self) -> tuple[Batch, Batch] | None:
        """Two batches holding this one's content, oldest first; None if it is one piece
        (a lone block of two or more records is cut in two blocks)."""
        first, second = Batch(), Batch()
        if len(self.records) >= 2:
            half = len(self.records) // 2
            first.parts, first.records = self.parts, self.records[:half]
            second.records = self.records[half:]
        elif self.records and self.parts:
            first.parts, second.records = self.parts, self.records
        elif len(self.parts) >= 2:
            half = len(self.parts) // 2
            first.parts, second.parts = self.parts[:half], self.parts[half:]
        elif (
            self.records
            and isinstance(self.records[0], (StepBlock, RanksBlock))
            and len(self.records[0]) > 1
        ):
            a, b = split_block(self.records[0])
            first.records, second.records = [a], [b]
        else:
            return None
        return first, second

    def absorb(self, newer: Batch, cap_rows: float) -> int:
        """Take ``newer``'s content after ours, then drop the oldest beyond ``cap_rows`` rows:
        whole parts first, then whole records and blocks (never half of one, so seq intervals
        and rows stay consistent; the newest piece always stays). Returns the rows dropped."""
        self.parts += newer.parts
        self.records += newer.records
        rows = sum(p.rows for p in self.parts) + sum(map(_record_rows, self.records))
        dropped = 0
        while rows > cap_rows and self.parts and (len(self.parts) > 1 or self.records):
            size = self.parts.pop(0).rows
            rows, dropped = rows - size, dropped + size
        gone = 0
        while rows > cap_rows and gone < len(self.records) - 1:
            size = _record_rows(self.records[gone])
            rows, dropped, gone = rows - size, dropped + size, gone + 1
        del self.records[:gone]
        return dropped


def _check_block(block: StepBlock) -> None:
    n = len(block.seq)
    lengths = {"time": len(block.time), "step": len(block.step), "epoch": len(block.epoch)}
    lengths.update((f"metric {m!r}", len(v)) for m, v in block.metrics.items())
    for name, length in lengths.items():
        if length != n:
            raise ValueError(
                f"StepBlock of run {block.run!r} rank {block.rank}: column {name} has "
                f"{length} entries for {n} records"
            )


def split_block(block: StepBlock | RanksBlock) -> tuple[Item, Item]:
    """The first and second half of ``block`` as two blocks."""
    if type(block) is RanksBlock:
        return _split_ranks(block)

    def cut(s: slice) -> StepBlock:
        metrics = {m: v[s] for m, v in block.metrics.items()}
        ident = (block.run, block.rank, block.world_size, block.host, block.pid)
        cols = (block.seq[s], block.time[s], block.step[s], block.epoch[s])
        return StepBlock(*ident, *cols, metrics, block.inc)

    h = len(block) // 2
    return cut(slice(None, h)), cut(slice(h, None))


def _record_rows(item: Item) -> int:
    """Buffered rows of one record (its ``recs`` row plus its table's rows) or block."""
    if type(item) is StepBlock or type(item) is RanksBlock:
        return len(item) * (1 + max(1, len(item.metrics)))
    if type(item) is TelemetryRecord:
        return 1 + len(item.values) + len(item.labels)
    return 1 + max(1, len(item.metrics)) if type(item) is StepRecord else 2


def _split_ranks(block: RanksBlock) -> tuple[RanksBlock, RanksBlock]:
    def cut(s: slice) -> RanksBlock:
        cols = (block.ranks[s], block.seq[s], block.time[s], block.hosts[s], block.pids[s],
                block.step[s], block.epoch[s])  # fmt: skip
        metrics = {m: v[s] for m, v in block.metrics.items()}
        return RanksBlock(block.run, block.world_size, *cols, metrics, block.incs[s])

    h = len(block) // 2
    return cut(slice(None, h)), cut(slice(h, None))
