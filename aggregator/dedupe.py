"""Dedupe: which of a batch's records are new, per (run, rank, incarnation, seq), and the
``restart`` event that goes before the first records of a rank's new incarnation; before it,
``as_blocks`` gathers each rank's step records of a batch into blocks. Pure."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rankwatch.agent.wire.records import RanksBlock, Record, StepBlock, StepRecord
from rankwatch.aggregator.restarts import Restarts
from rankwatch.aggregator.seqs import SeqTracker

log = logging.getLogger("rankwatch.service")

Item = Record | StepBlock | RanksBlock


def dedupe(items: Sequence[Item], seqs: SeqTracker, restarts: Restarts) -> tuple[list[Item], int]:
    """The items not seen before (a block whole when all of it is new; a ``RanksBlock`` also
    only when each of its ranks goes on in its newest incarnation), each new incarnation's
    steps preceded by its ``restart`` event, and how many records came in. ValueError, and
    nothing taken, when a RanksBlock is malformed (``RanksBlock.check``)."""
    for item in items:  # a malformed block is refused before anything of the batch is taken
        if type(item) is RanksBlock:
            item.check()
    accept, accept_many = seqs.accept, seqs.accept_many
    fresh: list[Item] = []
    received = 0
    for item in items:
        if type(item) is RanksBlock:
            received += len(item)
            news = seqs.accept_ranks(item.run, item.ranks, item.seq, item.incs)
            if news is None and restarts.continues(item):
                fresh.append(item)
                continue
            # new ranks, a restart or a resend: record by record (a restart goes before
            # its rank's steps)
            for i, ok in enumerate(news or [True] * len(item)):
                if ok:
                    rec = item.record(i)
                    _restart(rec, fresh, seqs, restarts)
                    fresh.append(rec)
            continue
        if not isinstance(item, StepBlock):
            received += 1
            if accept(item.run, item.rank, item.seq, item.inc):
                if type(item) is StepRecord:
                    _restart(item, fresh, seqs, restarts)
                fresh.append(item)
            continue
        received += len(item)
        new = accept_many(item.run, item.rank, item.seq, item.inc)
        if new is None:
            _restart(item, fresh, seqs, restarts)
            fresh.append(item)
        else:  # a resend overlapping what arrived: keep the new records only
            for i, ok in enumerate(new):
                if ok:
                    rec = item.record(i)
                    _restart(rec, fresh, seqs, restarts)
                    fresh.append(rec)
    return fresh, received


def _restart(
    item: StepRecord | StepBlock,
    fresh: list[Item],
    seqs: SeqTracker,
    restarts: Restarts,
) -> None:
    run, rank, inc = item.run, item.rank, item.inc
    stored = () if restarts.seen(run, rank) else seqs.stored_before(run, rank, inc)
    event = restarts.observe(item, stored)
    if event is not None:
        log.info(
            "rankwatch: %s rank %d restarted (incarnation %s -> %d) at step %d",
            run, rank, event.info["previous_inc"], inc, event.step,
        )  # fmt: skip
        fresh.append(event)


def as_blocks(items: Sequence[Item]) -> list[Item]:
    """The same records, with each rank's consecutive step records (one run, process and
    metric-name order) gathered into a StepBlock, so single-record frames take the block path
    (dedupe, store, merge) too. Each rank's records keep their order; across ranks, a rank's
    step records move up to where the batch's next event or heartbeat is (any rank's), which
    changes nothing: ranks are merged by step, and health sees each rank in its own order."""
    out: list[Item] = []
    pending: dict[tuple[str, int], list[StepRecord]] = {}
    for item in items:
        if type(item) is not StepRecord:
            _emit(pending, out)
            out.append(item)
            continue
        key = (item.run, item.rank)
        same = pending.get(key)
        if same is None:
            pending[key] = [item]
            continue
        first = same[0]
        if (
            item.pid != first.pid
            or item.inc != first.inc
            or item.host != first.host
            or item.world_size != first.world_size
            or list(item.metrics) != list(first.metrics)
        ):
            out.append(_one(same))  # a new process or metric set: a block of its own
            pending[key] = same = []
        same.append(item)
    _emit(pending, out)
    return out


def _emit(pending: dict[tuple[str, int], list[StepRecord]], out: list[Item]) -> None:
    out.extend(map(_one, pending.values()))
    pending.clear()


def _one(recs: list[StepRecord]) -> StepRecord | StepBlock:
    """A rank's gathered step records: the record itself when alone, else a block."""
    first = recs[0]
    if len(recs) == 1:
        return first
    metrics = {name: [r.metrics[name] for r in recs] for name in first.metrics}
    return StepBlock(
        first.run, first.rank, first.world_size, first.host, first.pid, [r.seq for r in recs],
        [r.time for r in recs], [r.step for r in recs], [r.epoch for r in recs], metrics,
        first.inc,
    )  # fmt: skip
