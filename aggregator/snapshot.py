"""What ``Aggregator.snapshot`` and the live rank tables are made of: a run's summary entry and
its ranks' entries, from the health, the detector's latest scores and verdicts, the latest
values and the seq gaps. Pure; the service copies the inputs under its lock and builds the
entries without it (building them takes far longer than the copy)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rankwatch.aggregator.divergence.types import Divergence, RankScore, z_map
from rankwatch.aggregator.feed import jsonable, rank_entry
from rankwatch.aggregator.health import RankHealth, run_state

MAX_GAPS_REPORTED = 20  # seq gaps per rank in the snapshot

RankInputs = tuple[
    dict[int, set[str]],  # rank -> metrics flagged
    dict[str, Mapping[int, RankScore]],  # metric -> latest scores
    list[tuple[RankHealth, dict[str, float], list[tuple[int, int]]]],  # health, values, gaps
]
Gaps = Callable[..., list[tuple[int, int]]]  # SeqTracker.gaps(run, rank, limit=, inc=)


def run_entry(
    name: str, states: Mapping[int, RankHealth], active: Iterable[Divergence]
) -> dict[str, Any]:
    """A run's summary: state, world size, last record time and step, active divergences."""
    steps = [h.last_step for h in states.values() if h.last_step is not None]
    return {
        "run": name,
        "state": run_state(states.values()),
        "world_size": max((h.world_size for h in states.values()), default=0),
        "last_time": max((h.last_seen for h in states.values()), default=None),
        "last_step": max(steps, default=None),
        "divergences": [jsonable(d) for d in active],
    }


def rank_inputs(
    run: str,
    ranks: Mapping[int, RankHealth],
    active: Iterable[Divergence],
    z: Mapping[tuple[str, str], Mapping[int, RankScore]],
    values: Mapping[tuple[str, int], Mapping[str, float]],
    gaps: Gaps,
    current_inc: Callable[[str, int], int],
) -> RankInputs:
    """The inputs of ``run``'s rank entries, copied: the caller holds its lock meanwhile."""
    flagged: dict[int, set[str]] = {}
    for d in active:
        flagged.setdefault(d.rank, set()).add(d.metric)
    scores = {m: sc for (r, m), sc in z.items() if r == run}
    rows = [
        (
            h,
            dict(values.get((run, rank), ())),
            gaps(run, rank, limit=MAX_GAPS_REPORTED, inc=current_inc(run, rank)),
        )
        for rank, h in ranks.items()
    ]
    return flagged, scores, rows


def rank_entries(inputs: RankInputs) -> list[dict[str, Any]]:
    flagged, scores, rows = inputs
    z_by_metric = {m: z_map(sc) for m, sc in scores.items()}
    return [
        rank_entry(
            h,
            values,
            {m: zs[h.rank] for m, zs in z_by_metric.items() if h.rank in zs},
            sorted(flagged.get(h.rank, ())),
            gaps,
        )
        for h, values, gaps in rows
    ]
