"""``GET /api/runs/{run}/ranks`` (the rank table: whole, or one page of it sorted and filtered
on the server) and ``GET /api/runs/{run}/nodes`` (the node map), on the API router of
``routes.py`` (registered when ``app.py`` imports this module; ``/api/run/X?run=`` too).

Both answer from the same table (``rankcols.Table``): a live run's rows (``ranktable.rows_of``
of its rank entries, built from a copy the snapshot takes under the aggregator's lock and never
under it), or a stored run's ranks read from the store as columns, with their latest stored
values and the detector's z of them, and rows built only for the ranks a page shows. A person
clicks through pages: the table is kept, a live run's for ``LIVE_ROWS_S`` (longer when it takes
long to build), a stored run's until its stored summary or its incidents change.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import HTTPException, Query, Request
from rankwatch.aggregator.provider import DataProvider

from . import rankcols, ranktable, views
from .jsonenc import StrictJSONResponse
from .rankcols import Columns
from .routes import _json, _metrics, _provider, _require_run, api, metric_query

LIVE_ROWS_S = 1.0  # a live run's table is at most this old (the stream says when it changed)
# ... or this many times as old as it took to build: at 100,000 live ranks a table takes about a
# second, and every open page asks again each time the stream says a rank changed
LIVE_BUILD_FACTOR = 5.0
CACHED_TABLES = 8  # (run, metric) tables kept

Text = Annotated[str | None, Query(max_length=1000)]  # checked in ranktable.parse_query
TableMetric = Annotated[
    str | None,
    metric_query(
        "the metric of the value and z columns and of the node map's max |z| "
        "(default: loss, else the run's first)"
    ),
]


@dataclass
class _Kept:
    """A built table (it keeps its orders once sorted, and what every page of it says)."""

    sig: Any  # what of the run changes the table: a stored run's summary and incidents
    expiry: float
    table: rankcols.Table
    state: str | None
    world_size: int | None
    cells: dict[str, Any] | None = None  # the node map, built when first asked


class _Tables:
    """(run, metric) -> the last few tables built."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # one build at a time: the page asks for the table and the node map at once, and two
        # builds of 100,000 ranks would take twice as long as one
        self.building = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()

    def get(self, key: tuple[str, str], sig: Any, now: float) -> _Kept | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.sig != sig or now > kept.expiry:
                return None
            self._kept.move_to_end(key)
            return kept

    def put(self, key: tuple[str, str], kept: _Kept) -> None:
        with self._lock:
            self._kept[key] = kept
            self._kept.move_to_end(key)
            while len(self._kept) > CACHED_TABLES:
                self._kept.popitem(last=False)


def _tables(request: Request) -> _Tables:
    state = request.app.state
    tables = getattr(state, "rank_tables", None)
    if tables is None:
        tables = state.rank_tables = _Tables()
    return tables


def _table(request: Request, run: str, metric: str | None) -> tuple[dict[str, Any], _Kept]:
    """The answer's head (run, state, metric ...) and the table. 404 for an unknown run, or a
    metric it has not logged."""
    provider = _provider(request)
    snapshot, entry = _require_run(provider, run)  # cheap: no rank entries
    names = views.order_metrics(_metrics(provider, run, entry))
    if metric is None:
        metric = "loss" if "loss" in names or not names else names[0]
    elif metric not in names:
        raise HTTPException(status_code=404, detail=f"run {run!r} has no metric {metric!r}")
    incidents = provider.read_incidents(run)
    now = time.time()
    live = entry is not None
    if live:
        sig: Any = "live"
        expiry = now + LIVE_ROWS_S
    else:
        found = next((r for r in provider.list_runs() if r["run"] == run), None)
        changed = max((i.get("updated") or 0.0 for i in incidents), default=0.0)
        records, last = (found["records"], found["last_time"]) if found else (None, None)
        sig = (records, last, len(incidents), changed)
        expiry = float("inf")
    tables = _tables(request)
    kept = tables.get((run, metric), sig, now)
    if kept is None:
        with tables.building:
            kept = tables.get((run, metric), sig, now)  # built meanwhile by another request
            if kept is None:
                began = time.monotonic()
                kept = _build(provider, run, metric, live, incidents, sig, expiry)
                if live:
                    took = time.monotonic() - began
                    kept.expiry = now + max(LIVE_ROWS_S, LIVE_BUILD_FACTOR * took)
                tables.put((run, metric), kept)
    head = {
        "run": run,
        "now": snapshot.get("now", now),
        "state": kept.state,
        "world_size": kept.world_size,
        "metric": metric,
        "live": live,
    }
    return head, kept


def _build(
    provider: DataProvider,
    run: str,
    metric: str,
    live: bool,
    incidents: list[dict[str, Any]],
    sig: Any,
    expiry: float,
) -> _Kept:
    roles = ranktable.roles_of(incidents)
    if not live:
        snapshot = provider.snapshot(run=run, ranks=False, history=True)
        found = views.find_run(snapshot, run) or {}
        latest, zs = _stored_values(provider, run, metric)
        table = rankcols.stored(provider.read_stored_ranks(run), metric, roles, latest, zs)
        return _Kept(sig, expiry, table, found.get("state"), found.get("world_size"))
    full = provider.snapshot(run=run, ranks=True)
    found = views.find_run(full, run) or {}
    rows = ranktable.rows_of(found.get("ranks") or [], metric, roles)
    table = rankcols.of_rows(rows)
    return _Kept(sig, expiry, table, found.get("state"), found.get("world_size"))


def _stored_values(provider: DataProvider, run: str, metric: str) -> tuple[Columns, Columns]:
    """A stored run's latest value per rank, and the detector's z of them (its entries have
    neither), each as (ranks, values) columns: at 100,000 ranks a dict per rank cost more
    than the detector."""
    ranks, values = provider.read_latest_values(run, metric)
    return (ranks, values), views.latest_z_columns(ranks, values, metric)


@api.get("/runs/{run:run}/ranks", summary="The rank table: every rank, or one page of it")
def run_ranks(
    request: Request,
    run: str,
    sort: Annotated[
        str | None,
        Query(
            max_length=1000,
            description="attention (the default: odd ranks first), rank, "
            "state, last_step, value, z or host; any of these parameters asks for a page",
        ),
    ] = None,
    desc: Annotated[str | None, Query(max_length=1000, description="1: largest first")] = None,
    page: Annotated[str | None, Query(max_length=1000, description="from 1")] = None,
    size: Annotated[
        str | None, Query(max_length=1000, description=f"rows, at most {ranktable.MAX_PAGE_SIZE}")
    ] = None,
    filter: Annotated[
        str | None,
        Query(
            max_length=1000,
            description="a state (crashed, stalled ...), odd, flagged, "
            "culprit, affected, a rank or range (8-15), or part of a host name",
        ),
    ] = None,
    host: Annotated[
        str | None, Query(max_length=1000, description="this host's ranks only")
    ] = None,
    metric: TableMetric = None,
) -> StrictJSONResponse:
    provider = _provider(request)
    if all(p is None for p in (sort, desc, page, size, filter, host)):
        _require_run(provider, run)
        # history: a stored run's ranks too, with their final states
        snapshot = provider.snapshot(run=run, ranks=True, history=True)
        entry = views.find_run(snapshot, run) or {}
        return _json(
            {
                "run": run,
                "now": snapshot.get("now", time.time()),
                "state": entry.get("state"),
                "world_size": entry.get("world_size"),
                "ranks": entry.get("ranks") or [],
            }
        )
    try:
        query = ranktable.parse_query(sort, desc, page, size, filter, host)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    head, kept = _table(request, run, metric)
    return _json({**head, **kept.table.select(query)})


@api.get("/runs/{run:run}/nodes", summary="The ranks by node (or rank block), each as its worst")
def run_nodes(
    request: Request,
    run: str,
    metric: TableMetric = None,
) -> StrictJSONResponse:
    head, kept = _table(request, run, metric)
    if kept.cells is None:
        kept.cells = ranktable.compact_cells(kept.table.node_cells())
    return _json({**head, **kept.cells})
