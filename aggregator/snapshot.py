"""What ``Aggregator.snapshot`` and the live rank tables are made of: a run's summary entry and
its ranks' entries, from the health, the detector's latest scores and verdicts, the latest
values and the seq gaps. Pure; the service copies the inputs under its lock and builds the
entries without it (building them takes far longer than the copy)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rankwatch.aggregator.divergence.listing import ActiveList
from rankwatch.aggregator.divergence.types import RankScore, z_map
from rankwatch.aggregator.feed import jsonable, rank_entry
from rankwatch.aggregator.health import RankHealth, RankTable, run_state
from rankwatch.aggregator.incidents.model import Incident
from rankwatch.aggregator.ranksummary import (
    SUMMARY_RANKS,
    RunDigest,
    odd_ranks,
    page_ranks,
    summary_fields,
)

if TYPE_CHECKING:
    from rankwatch.aggregator.service import Aggregator

MAX_GAPS_REPORTED = 20  # seq gaps per rank in the snapshot
EMPTY = RankTable()  # the ranks of a run health no longer knows

RankInputs = tuple[
    dict[int, set[str]],  # rank -> metrics flagged
    dict[str, Mapping[int, RankScore]],  # metric -> latest scores
    list[tuple[RankHealth, dict[str, float], list[tuple[int, int]]]],  # health, values, gaps
]
Gaps = Callable[..., list[tuple[int, int]]]  # SeqTracker.gaps(run, rank, limit=, inc=)


def run_entry(name: str, states: Mapping[int, RankHealth], active: ActiveList) -> dict[str, Any]:
    """A run's summary: state, world size, last record time and step, active divergences."""
    steps = [h.last_step for h in states.values() if h.last_step is not None]
    return {
        "run": name,
        "state": run_state(states.values()),
        "world_size": max((h.world_size for h in states.values()), default=0),
        "last_time": max((h.last_seen for h in states.values()), default=None),
        "last_step": max(steps, default=None),
        **divergence_fields(active),
    }


def divergence_fields(active: ActiveList) -> dict[str, Any]:
    """A run entry's active divergences: the first ``listing.SHOWN`` (``divergences``), how
    many in all and by kind, and how many ranks they are of."""
    return {
        "divergences": [jsonable(d) for d in active.listed],
        "divergences_active": active.total,
        "divergences_by_kind": dict(active.by_kind),
        "ranks_divergent": len(active.ranks),
    }


def rank_inputs(
    run: str,
    ranks: Mapping[int, RankHealth],
    flagged: dict[int, set[str]],
    z: Mapping[tuple[str, str], Mapping[int, RankScore]],
    values: Mapping[tuple[str, int], Mapping[str, float]],
    gaps: Gaps,
    current_inc: Callable[[str, int], int],
) -> RankInputs:
    """The inputs of ``run``'s rank entries, copied: the caller holds its lock meanwhile.
    ``flagged``: rank -> the metrics it is flagged on, for the flagged of ``ranks``
    (``DivergenceDetector.flagged_on``)."""
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


def incident_body(inc: Incident, ranks: Mapping[int, RankHealth]) -> dict[str, Any]:
    """An incident as stored and streamed: ``Incident.as_dict()`` with ``hosts``, rank ->
    [host, pid] of its culprits, affected and terminated ranks as health knows them now, so a
    later `serve` (which has no rank entries for them) still says where they ran."""
    body = jsonable(inc.as_dict())
    hosts = {}
    for rank in inc.ranks:
        h = ranks.get(rank)
        if h is not None and h.host:
            hosts[str(rank)] = [h.host, h.pid]
    body["hosts"] = hosts
    return body


# --- history runs: stored, no live state (before this aggregator started, imported, retired) --

# A stored rank's final state: its last life event says how it ended. Without one its records
# just stop, and the store cannot tell a clean exit from a kill: "unknown" says so.
STORED_RANK_STATES = {"end": "finished", "crash": "crashed"}
UNKNOWN_END = "unknown"


def stored_rank_state(ended: bool, life: str | None) -> str:
    """A stored rank's final state from its summary's ``ended`` and its last life event."""
    return STORED_RANK_STATES.get(life or "", UNKNOWN_END) if ended else UNKNOWN_END


def stored_rank_entry(row: Mapping[str, Any], life: str | None) -> dict[str, Any]:
    """A stored rank (a ``Store.ranks`` row) as a rank entry; ``life``: its last start, end or
    crash event, if any. ``last_seen`` is the records' own time (the training's clock)."""
    state = stored_rank_state(bool(row.get("ended")), life)
    step = row.get("last_step")
    at = f" at step {step:,}" if isinstance(step, int) else ""
    message = {
        "finished": f"finished{at}",
        "crashed": f"crashed{at}",
    }.get(state, f"records stop{at} with no end or crash event")
    return {
        "rank": row["rank"],
        "state": state,
        "host": row.get("host") or "",
        "pid": row.get("pid") or 0,
        "world_size": row.get("world_size") or 0,
        "last_step": step,
        "last_seen": row.get("last_time"),
        "first_seen": row.get("first_time"),
        "records": row.get("records"),
        "message": message,
        "message_line": message,
        "divergent": [],
        "z": {},
        "values": {},
        "dropped": 0,
        "gaps": [],
    }


def stored_run_state(states: Mapping[str, int], world_size: int) -> str:
    """``crashed`` (any rank crashed), ``finished`` (every rank of the world finished), else
    ``ended``: the records stop, and not every rank said why. ``states``: state -> ranks."""
    if states.get("crashed"):
        return "crashed"
    finished = states.get("finished", 0)
    if finished and finished == sum(states.values()) and finished >= world_size:
        return "finished"
    return "ended"


def stored_run_entry(
    summary: Mapping[str, Any], states: Mapping[str, int], metrics: Sequence[str]
) -> dict[str, Any]:
    """A stored run (a ``Store.runs`` row and its ranks counted by state) as a snapshot run
    entry, with ``history: true``, its ranks' states counted in ``ended_without_event`` when
    some ranks gave no reason. ``last_time`` and ``record_time`` are the records' own time."""
    seen = sum(states.values())
    world = int(summary.get("world_size") or 0) or seen
    return {
        "run": summary["run"],
        "state": stored_run_state(states, world),
        "history": True,
        "world_size": world,
        "first_time": summary.get("first_time"),
        "last_time": summary.get("last_time"),
        "record_time": summary.get("last_time"),
        "last_step": summary.get("last_step"),
        "records": summary.get("records"),
        "ended_without_event": states.get(UNKNOWN_END, 0),
        "divergences": [],
        "incidents": [],
        "ranks_seen": seen,
        "rank_states": {k: n for k, n in states.items() if n},
        "metrics": sorted(metrics),
    }


def newest_first(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The one run order of ``status``, ``/api/status`` and ``/api/runs``: latest record first
    (ties by name, so the order is stable)."""

    def key(r: Mapping[str, Any]) -> tuple[float, str]:
        t = r.get("last_time")
        return (-(float(t) if isinstance(t, (int, float)) else 0.0), str(r.get("run")))

    return sorted(runs, key=key)


def build_snapshot(
    agg: Aggregator,
    now: float,
    run: str | None,
    ranks: bool,
    history: bool,
    summary: bool = False,
    page: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``Aggregator.snapshot``: the inputs copied under the service's lock, the entries built
    without it. A run of more than ``SUMMARY_RANKS`` ranks (any run, with ``page``) is read
    from the tick's health snapshot and its digest, and only its listed ranks are evaluated
    now: every rank with neither ``summary`` nor ``page``, its odd ones with ``summary``, one
    page with ``page``."""
    inputs: dict[str, RankInputs] = {}
    with agg.lock:
        cached = agg.health_now(now)
    # A health snapshot is never changed once made: the digests of its big runs are computed
    # here, without the lock ingest needs (a pass over every rank when its table has not kept
    # its tally yet).
    for name, states in list(cached.items()):
        if (run is None or name == run) and (page is not None or len(states) > SUMMARY_RANKS):
            agg.digests.get(name, states, now)
    with agg.lock:
        cached = agg.health_now(now)  # the same, or newer by a share of the rolling sweep
        names = list(cached) if run is None else [run] if run in cached else []
        runs = []
        for name in names:
            big = page is not None or len(cached[name]) > SUMMARY_RANKS
            if big:
                states = cached[name]
                d = agg.digests.get(name, states, now)
                entry = big_run_entry(name, d, agg.detector.listing(name))
            else:
                states = agg.health.snapshot(now, name).get(name, EMPTY)
                entry = run_entry(name, states, agg.detector.listing(name))
            known = agg.incidents.incidents(name)
            entry["incidents"] = [jsonable(i.as_dict()) for i in known if i.state == "firing"]
            entry["incidents_total"] = len(known)
            if big and (summary or page is not None):
                listed = _listed(agg, name, states, d, entry, page, now)
                inputs[name] = agg.rank_inputs_of(name, agg.health.health_of(name, listed, now))
            elif ranks:
                fresh = agg.health.snapshot(now, name).get(name, EMPTY) if big else states
                inputs[name] = agg.rank_inputs_of(name, fresh)
            else:
                entry["ranks_seen"] = len(states)
                entry["metrics"] = (
                    agg.digests.metrics(name, states, agg.values, now) if big
                    else metric_names(name, states, agg.values)
                )  # fmt: skip
            runs.append(entry)
        agg.digests.forget_others(cached)
    for entry in runs:
        if entry["run"] in inputs:
            entry["ranks"] = rank_entries(inputs[entry["run"]])
    if history:
        stored = agg.store.runs()
        record_times = {s["run"]: s["last_time"] for s in stored}
        for entry in runs:
            entry["record_time"] = record_times.get(entry["run"])
        live = {entry["run"] for entry in runs}
        runs = newest_first([*runs, *agg.stored_runs.entries(stored, live, run, ranks)])
    return {"now": now, "runs": runs}


def metric_names(
    run: str, ranks: Iterable[int], values: Mapping[tuple[str, int], Mapping[str, float]]
) -> list[str]:
    """The live metric names of ``run``: those of its ranks' latest values."""
    return sorted({m for rank in ranks for m in values.get((run, rank), ())})


def big_run_entry(name: str, d: RunDigest, active: ActiveList) -> dict[str, Any]:
    """``run_entry`` of a big run, from its digest."""
    return {
        "run": name,
        "state": d.state,
        "world_size": d.world_size,
        "last_time": d.last_time,
        "last_step": d.last_step,
        **divergence_fields(active),
    }


def _listed(
    agg: Aggregator,
    name: str,
    states: Mapping[int, RankHealth],
    d: RunDigest,
    entry: dict[str, Any],
    page: tuple[int, int] | None,
    now: float,
) -> list[int]:
    """The ranks a summary (or a page) of a big run lists; the summary's fields into
    ``entry``. Under the service's lock."""
    active = agg.detector.listing(name)
    first = [div.rank for div in active.listed]

    def make() -> tuple[list[int], int]:
        current = agg.restarts.current
        gapped = [rank for _, rank, inc in agg.seqs.gapped(name) if inc == current(name, rank)]
        return odd_ranks(d, active.ranks, gapped, first=first)

    key = (active.ranks, tuple(first), agg.seqs.gap_version, agg.restarts.version)
    listed, odd = agg.digests.odd(name, states, now, key, make)
    if page is not None:
        listed = page_ranks(states, *page)
    entry.update(summary_fields(d, odd, page))
    return listed
