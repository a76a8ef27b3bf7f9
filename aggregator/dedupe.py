"""Dedupe: which of a batch's records are new, per (run, rank, incarnation, seq), and the
``restart`` event that goes before the first records of a rank's new incarnation. Pure."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rankwatch.agent.wire.records import Record, StepBlock, StepRecord
from rankwatch.aggregator.restarts import Restarts
from rankwatch.aggregator.seqs import SeqTracker

log = logging.getLogger("rankwatch.service")


def dedupe(
    items: Sequence[Record | StepBlock], seqs: SeqTracker, restarts: Restarts
) -> tuple[list[Record | StepBlock], int]:
    """The items not seen before (a block whole when all of it is new), each new
    incarnation's steps preceded by its ``restart`` event, and how many records came in."""
    accept, accept_many = seqs.accept, seqs.accept_many
    fresh: list[Record | StepBlock] = []
    received = 0
    for item in items:
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
    fresh: list[Record | StepBlock],
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
