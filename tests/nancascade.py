"""A NaN cascade's step records, for the tests that feed one to a real aggregator: one card's
values NaN at one step, every card's from the next."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rankwatch.agent.wire.records import StepRecord


def cascade_step(
    run: str, step: int, ranks: int, first: int, onset: int, metrics: Sequence[str], now: float
) -> list[StepRecord]:
    """Every rank's record of ``step``: ``first``'s values NaN from ``onset``, every rank's
    from ``onset + 1``; the others near 1 before."""
    out = []
    for r in range(ranks):
        bad = step > onset or (step == onset and r == first)
        value = math.nan if bad else 1.0 + r % 5 * 1e-3
        out.append(StepRecord(run, r, step, now, ranks, f"node{r // 8}", 100 + r, step, 0,
                              dict.fromkeys(metrics, value)))  # fmt: skip
    return out
