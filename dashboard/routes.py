"""The dashboard's HTTP API, over the ``DataProvider`` only (``aggregator/provider.py``;
``POST /api/ingest``, the one route that writes, is in ``ingest.py``; the rank table and the
node map are in ``rankroutes.py``).

Store reads block (DuckDB), so the routes that touch the store are plain ``def``: FastAPI
runs them in its thread pool and the event loop keeps serving the live stream meanwhile.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from rankwatch.agent.wire import records
from rankwatch.aggregator.provider import (
    MAX_PAGE_RANKS,
    Alert,
    DataProvider,
    ExportError,
    SeriesColumns,
    Snapshot,
    compare_medians,
    metric_info,
    previous_run,
)
from starlette.background import BackgroundTask
from starlette.convertors import Convertor, register_url_convertor

from . import prom, ranktable, seriesfmt, views
from .ingest import ingest_counts
from .jsonenc import StrictJSONResponse

DEFAULT_MAX_POINTS = 2000  # per rank, before the store's min/max downsampling
MAX_MAX_POINTS = 20_000
DEFAULT_HEATMAP_BUCKETS = 120  # step columns of the divergence heatmap
MAX_HEATMAP_BUCKETS = 600
ALERT_HISTORY_LIMIT = 200
NO_EARLIER_RUN = "no earlier run of the same job"  # /compare's ref_reason where ref is null
STATUS_PAGE_RANKS = 1000  # ranks per /api/status page when only offset is given
EXPORT_MEDIA_TYPES = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet"}

api = APIRouter(prefix="/api", tags=["api"])
ops = APIRouter(tags=["operations"])


class RunName(Convertor[str]):
    """``{run:run}``: a run name in a path, whatever it holds. The wire takes any string as a run
    name, and Starlette's ``path`` convertor (``.*``) stops at a line break, so a run whose name
    held one was listed but every one of its routes answered 404."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("run", RunName())

Ranks = Annotated[str | None, Query(description="Selected ranks, e.g. '0,3,8-11'", max_length=4000)]
Step = Annotated[int | None, Query(description="First/last step of the window (inclusive)")]


def metric_query(description: str) -> Any:
    """An optional ``metric`` query parameter: one metric name, no longer than the wire allows."""
    return Query(max_length=records.MAX_NAME_CHARS, description=description)


def _provider(request: Request) -> DataProvider:
    return request.app.state.provider


def _json(content: Any) -> StrictJSONResponse:
    # Returning a response skips FastAPI's own encoding, which would turn NaN into null
    # and walk every point of a series once more.
    return StrictJSONResponse(content)


def _bad(message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=message)


def _require_run(
    provider: DataProvider, run: str, ranks: bool = False
) -> tuple[Snapshot, dict[str, Any] | None]:
    """The snapshot of ``run`` and its entry; 404 when neither the store nor the live state
    knows the run. ``ranks``: with the per-rank entries (costly for thousands of ranks, and
    built under the lock ingest needs), else ``ranks_seen`` and ``metrics`` only."""
    snapshot = provider.snapshot(run=run, ranks=ranks)
    entry = views.find_run(snapshot, run)
    if entry is None and all(r.get("run") != run for r in provider.list_runs()):
        raise HTTPException(status_code=404, detail=f"unknown run {run!r}")
    return snapshot, entry


def _require_metric(
    provider: DataProvider, run: str, entry: dict[str, Any] | None, metric: str
) -> None:
    if metric not in _metrics(provider, run, entry):
        raise HTTPException(status_code=404, detail=f"run {run!r} has no metric {metric!r}")


def _metrics(provider: DataProvider, run: str, entry: dict[str, Any] | None) -> set[str]:
    """Stored metrics plus those only live so far (seen, not flushed to the store yet)."""
    names = set(provider.list_metrics(run))
    names.update((entry or {}).get("metrics") or ())
    for rank in (entry or {}).get("ranks") or []:
        names.update(rank.get("values") or {})
    return names


def _stored_rank_count(provider: DataProvider, run: str) -> int:
    """The ranks a run without live state has in the store (its snapshot entry has none)."""
    return next((int(r.get("ranks") or 0) for r in provider.list_runs() if r["run"] == run), 0)


def _parse_ranks(text: str | None) -> list[int]:
    try:
        return views.parse_ranks(text)
    except ValueError as exc:
        raise _bad(f"ranks: {exc}") from None


def _check_window(start: int | None, end: int | None) -> None:
    if start is not None and end is not None and end < start:
        raise _bad(f"end ({end}) is before start ({start})")


def _alerted(provider: DataProvider, run: str) -> list[tuple[int | None, str | None]]:
    seen: list[Alert] = [*provider.alerts_firing(), *provider.alerts_history(ALERT_HISTORY_LIMIT)]
    out: list[tuple[int | None, str | None]] = []
    for alert in seen:
        if alert.run == run:
            # a grouped alert (rank None) lists its ranks; the first few are worth a line
            group = alert.ranks[: views.MAX_OUTLIER_RANKS]
            out.extend((rank, alert.metric) for rank in (group or (alert.rank,)))
    return out


@api.get("/runs", summary="Every run: live state, world size, ranks, start, last record")
def list_runs(request: Request) -> StrictJSONResponse:
    provider = _provider(request)
    now = time.time()
    snapshot = provider.snapshot(now=now, ranks=False, history=True)
    everyone = snapshot["runs"]
    live = [r for r in everyone if not r.get("history")]
    runs = views.merge_runs(provider.list_runs(), {**snapshot, "runs": live})
    # The order and the final states are the snapshot's, so the page and `rankwatch status`
    # list the same runs the same way; "state" stays "history" for a run without live state.
    final: dict[str, Any] = {r["run"]: r for r in everyone}
    order = {r["run"]: i for i, r in enumerate(everyone)}
    for row in runs:
        entry: dict[str, Any] = final.get(row["run"]) or {}
        row["final_state"] = entry.get("state") if entry.get("history") else None
        row["record_time"] = entry.get("record_time")
    runs.sort(key=lambda r: order.get(r["run"], -1))
    return _json({"now": snapshot.get("now", now), "runs": runs})


@api.get("/runs/{run:run}/metrics", summary="Metric names a run has logged, in chart order")
def run_metrics(request: Request, run: str) -> StrictJSONResponse:
    provider = _provider(request)
    _, entry = _require_run(provider, run)
    return _json({"run": run, "metrics": views.order_metrics(_metrics(provider, run, entry))})


@api.get("/runs/{run:run}/series", summary="One metric of a run, every rank or band + outliers")
def run_series(
    request: Request,
    run: str,
    metric: Annotated[str, Query(min_length=1, max_length=records.MAX_NAME_CHARS)],
    start: Step = None,
    end: Step = None,
    max_points: Annotated[int, Query(ge=10, le=MAX_MAX_POINTS)] = DEFAULT_MAX_POINTS,
    ranks: Ranks = None,
    view: Annotated[
        Literal["auto", "ranks", "band"],
        Query(description="auto: every rank up to 32 ranks, band + outliers beyond"),
    ] = "auto",
    fmt: Annotated[
        Literal["json", "bin"],
        Query(
            alias="format",
            description="json, or bin: the same fields with the points as little-endian "
            "float64 columns (application/octet-stream; layout in dashboard/seriesfmt.py)",
        ),
    ] = "json",
    minmax: Annotated[
        bool,
        Query(description="each point's bucket min and max; false: step and value only"),
    ] = True,
) -> Response:
    provider = _provider(request)
    _check_window(start, end)
    selected = _parse_ranks(ranks)
    _, entry = _require_run(provider, run)
    _require_metric(provider, run, entry, metric)
    total = views.rank_count(entry) or _stored_rank_count(provider, run)
    band_mode = view == "band" or (view == "auto" and total > views.BAND_THRESHOLD_RANKS)
    # the incident's culprits and the ranks it reached get lines of their own, flagged on this
    # metric or not: a stored run of 100,000 ranks has no live verdicts to name them
    roles = ranktable.roles_of(provider.read_incidents(run)) if band_mode else {}
    outliers = views.outlier_ranks(entry, metric, _alerted(provider, run), first=roles)
    wanted = sorted({*outliers, *selected}) if band_mode else None
    # Numpy columns from the store to the response: a million points as Python lists would
    # cost more than the query (seriesfmt.py).
    series = SeriesColumns.empty()
    if wanted or not band_mode:
        series = provider.read_series(
            run, metric, ranks=wanted, start=start, end=end, max_points=max_points
        )
    band = provider.read_band(run, metric, start=start, end=end, max_points=max_points)
    head = {
        "run": run,
        "metric": metric,
        "mode": "band" if band_mode else "ranks",
        "start": start,
        "end": end,
        "max_points": max_points,
        "ranks_total": total or len(series),
        "selected": selected,
        "outliers": outliers,
        **metric_info(metric),  # unit and nonnegative, for the chart's axis
    }
    if fmt == "bin":
        body = seriesfmt.encode(head, series, band, minmax)
        return Response(body, media_type=seriesfmt.MEDIA_TYPE)
    points = seriesfmt.series_json(series, minmax)
    return _json({**head, "series": points, "band": seriesfmt.band_json(band)})


@api.get("/runs/{run:run}/heatmap", summary="Robust z per rank per step bucket (heatmap)")
def run_heatmap(
    request: Request,
    run: str,
    metric: Annotated[str, Query(min_length=1, max_length=records.MAX_NAME_CHARS)],
    start: Step = None,
    end: Step = None,
    buckets: Annotated[int, Query(ge=2, le=MAX_HEATMAP_BUCKETS)] = DEFAULT_HEATMAP_BUCKETS,
) -> StrictJSONResponse:
    provider = _provider(request)
    _check_window(start, end)
    _, entry = _require_run(provider, run)
    _require_metric(provider, run, entry, metric)
    series = provider.read_series_lists(run, metric, start=start, end=end, max_points=buckets)
    steps, width, grid = views.bucket_series(series, buckets)
    cells = views.heat_grid(grid, len(steps), metric)
    ranks = sorted(cells.z)
    return _json(
        {
            "run": run,
            "metric": metric,
            "steps": steps,
            "width": width,
            "ranks": ranks,
            "z": [cells.z[rank] for rank in ranks],
            # The detector's verdict per cell: the only cells the page paints as a fault.
            "flagged": [cells.flagged[rank] for rank in ranks],
            "last_step": steps[-1] + width - 1 if steps else None,
        }
    )


RankOffset = Annotated[
    int | None, Query(ge=0, description="list the live runs' ranks from this one, in rank order")
]
RankLimit = Annotated[
    int | None,
    Query(ge=1, le=MAX_PAGE_RANKS, description=f"that many (default {STATUS_PAGE_RANKS})"),
]
_SUMMARY_FIELDS = ("ranks_seen", "ranks_odd", "ranks_summarised", "ranks_offset", "ranks_limit")


def _rank_page(offset: int | None, limit: int | None) -> tuple[int, int] | None:
    paged = offset is not None or limit is not None
    return (offset or 0, limit or STATUS_PAGE_RANKS) if paged else None


@api.get("/runs/{run:run}/divergence", summary="Active divergences and latest z per rank")
def run_divergence(
    request: Request, run: str, offset: RankOffset = None, limit: RankLimit = None
) -> StrictJSONResponse:
    """As ``/api/status`` lists ranks: a live run of more than ``SUMMARY_RANKS`` ranks lists
    its odd ones (the divergent among them), with ``ranks_seen`` and ``ranks_odd``;
    ``offset``/``limit`` read every rank a page at a time. The active divergences are listed
    as in ``/api/status``: the first ``listing.SHOWN`` to start, and how many in all
    (``divergences_active``, ``divergences_by_kind``); each listed rank's ``divergent`` names
    its flagged metrics."""
    provider = _provider(request)
    snapshot = provider.status_snapshot(run=run, page=_rank_page(offset, limit), history=False)
    entry = views.find_run(snapshot, run)
    if entry is None and all(r.get("run") != run for r in provider.list_runs()):
        raise HTTPException(status_code=404, detail=f"unknown run {run!r}")
    entry = entry or {}
    return _json(
        {
            "run": run,
            "divergences": entry.get("divergences") or [],
            "divergences_active": entry.get("divergences_active", 0),
            "divergences_by_kind": entry.get("divergences_by_kind") or {},
            **{k: entry[k] for k in _SUMMARY_FIELDS if k in entry},
            "ranks": [
                {
                    "rank": r.get("rank"),
                    "z": r.get("z") or {},
                    "divergent": r.get("divergent") or [],
                }
                for r in entry.get("ranks") or []
            ],
        }
    )


@api.get("/runs/{run:run}/events", summary="Start, end, crash, pause ... events of a run")
def run_events(request: Request, run: str) -> StrictJSONResponse:
    provider = _provider(request)
    _require_run(provider, run)
    events = provider.read_events(run)
    return _json({"run": run, "events": events})


@api.get("/runs/{run:run}/incidents", summary="A run's incidents: culprit, cause, timeline")
def run_incidents(request: Request, run: str) -> StrictJSONResponse:
    provider = _provider(request)
    _require_run(provider, run)
    return _json({"run": run, "incidents": provider.read_incidents(run)})


@api.get("/runs/{run:run}/commands", summary="Commands sent to a run's ranks and their answers")
def run_commands(request: Request, run: str) -> StrictJSONResponse:
    provider = _provider(request)
    _require_run(provider, run)
    return _json({"run": run, "commands": provider.read_commands(run)})


@api.get("/runs/{run:run}/stacks", summary="Where stalled ranks are: stack samples, grouped")
def run_stacks(request: Request, run: str) -> StrictJSONResponse:
    provider = _provider(request)
    _require_run(provider, run)
    return _json(provider.read_stacks(run))


@api.get("/runs/{run:run}/compare", summary="A run's medians against a reference run's")
def run_compare(
    request: Request,
    run: str,
    ref: Annotated[
        str | None,
        Query(
            max_length=records.MAX_NAME_CHARS,
            description="the reference run; default: the previous run of the same job (the "
            "script stem of a derived run name)",
        ),
    ] = None,
) -> StrictJSONResponse:
    provider = _provider(request)
    _require_run(provider, run)
    if ref is None:
        found = previous_run(run, provider.list_runs())
        if found is None:
            # A job's first run: nothing is missing, so no 404 (which every page of such a
            # run would log as an error); ``ref`` null says there is nothing to compare.
            return _json(
                {
                    "run": run,
                    "ref": None,
                    "ref_reason": NO_EARLIER_RUN,
                    "metrics": [],
                    "only_in_run": views.order_metrics(provider.list_metrics(run)),
                    "only_in_ref": [],
                }
            )
        ref, stem = found
        reason = f"the previous run of job {stem!r}"
    else:
        _require_run(provider, ref)
        reason = "given"
    mine, theirs = set(provider.list_metrics(run)), set(provider.list_metrics(ref))
    metrics = []
    for metric in views.order_metrics(mine & theirs):
        bands = [provider.read_band(name, metric, max_points=MAX_MAX_POINTS) for name in (run, ref)]
        metrics.append({"metric": metric, **compare_medians(*bands)})
    return _json(
        {
            "run": run,
            "ref": ref,
            "ref_reason": reason,
            "metrics": metrics,
            "only_in_run": views.order_metrics(mine - theirs),
            "only_in_ref": views.order_metrics(theirs - mine),
        }
    )


@api.get("/runs/{run:run}/export", summary="A run's stored step rows as a CSV or Parquet file")
def run_export(
    request: Request,
    run: str,
    fmt: Annotated[
        Literal["csv", "parquet"],
        Query(alias="format", description="csv, or parquet (the long rows of `rankwatch export`)"),
    ] = "csv",
    what: Annotated[
        Literal["steps", "telemetry"],
        Query(description="steps (the metrics), or telemetry (time, source, device, name, value)"),
    ] = "steps",
) -> FileResponse:
    provider = _provider(request)
    _require_run(provider, run)
    # DuckDB writes the file (COPY) without the rows passing through Python; the response
    # streams it and the directory goes once it is sent.
    folder = Path(tempfile.mkdtemp(prefix="rankwatch-export-"))
    path = folder / f"export.{fmt}"
    try:
        if what == "telemetry":
            rows = provider.export_telemetry(run, path, fmt)
            if not rows:
                path.write_bytes(b"")
        else:
            rows = provider.export_run(run, path, fmt)
    except ExportError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise HTTPException(status_code=404, detail=str(exc)) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return FileResponse(
        path,
        media_type=EXPORT_MEDIA_TYPES[fmt],
        filename=export_filename(run, fmt),
        headers={"X-Rankwatch-Rows": str(rows)},
        background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True),
    )


def export_filename(run: str, fmt: str) -> str:
    """A file name for ``run`` that any file system takes (a run name may hold anything)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run).strip("._") or "run"
    return f"{safe[:100]}.{fmt}"


@api.get("/alerts", summary="Alerts firing now and the recent history")
def list_alerts(
    request: Request,
    run: Annotated[str | None, Query(max_length=records.MAX_NAME_CHARS)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = ALERT_HISTORY_LIMIT,
) -> StrictJSONResponse:
    provider = _provider(request)
    firing = [a for a in provider.alerts_firing() if run is None or a.run == run]
    history = [a for a in provider.alerts_history(limit) if run is None or a.run == run]
    return _json({"firing": firing, "history": history})


@api.get("/status", summary="Every run, live or stored, newest first: `rankwatch status`")
def status(
    request: Request,
    run: Annotated[
        str | None,
        Query(
            max_length=records.MAX_NAME_CHARS,
            description="only this run (a stored run of many ranks lists only its first 64 "
            "unfinished ones)",
        ),
    ] = None,
    offset: RankOffset = None,
    limit: RankLimit = None,
) -> StrictJSONResponse:
    """A live run of more than ``SUMMARY_RANKS`` ranks lists its odd ranks (not alive,
    divergent, missing or dropping records), with ``rank_states`` (state -> count),
    ``ranks_seen`` and ``ranks_odd``; ``offset``/``limit`` read every rank a page at a time."""
    return _json(_provider(request).status_snapshot(run=run, page=_rank_page(offset, limit)))


@api.get("/stream", summary="Server-Sent Events: live increments (points, ranks, alerts ...)")
async def stream(
    request: Request,
    run: Annotated[str | None, Query(max_length=records.MAX_NAME_CHARS)] = None,
    ranks: Annotated[
        Literal["tables", "changes"],
        Query(
            description="tables: rank tables (whole, then what changed); changes: only how "
            "many ranks changed, for a page that reads its table a page at a time"
        ),
    ] = "tables",
) -> StreamingResponse:
    hub = request.app.state.live
    return StreamingResponse(
        hub.stream(run, tables=ranks == "tables"),
        media_type="text/event-stream",
        # no-transform and X-Accel-Buffering keep reverse proxies from holding events back.
        headers={"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"},
    )


@ops.get("/healthz", summary="Liveness: the process answers", include_in_schema=True)
async def healthz() -> StrictJSONResponse:
    return _json({"ok": True})


@ops.get("/metrics", summary="Prometheus text exposition", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    provider = _provider(request)
    counters = {
        **provider.counters(),
        **ingest_counts(request).counters(),
        **request.app.state.access_counts.counters(),
        **request.app.state.bodies.counters(),
        **request.app.state.command_counts.counters(),  # checkpoint / stop asked over HTTP
    }
    # a run of many ranks: its counts by state and its odd ranks' series (ranksummary.py)
    snapshot = provider.status_snapshot(history=False)
    body = prom.render(snapshot, counters, len(provider.alerts_firing()),
                       provider.telemetry_latest())  # fmt: skip
    return PlainTextResponse(body, media_type=prom.CONTENT_TYPE)


RUN_PATH_PREFIXES = ("/api/runs/{run:path}/", "/api/runs/{run:run}/")


def run_query_routes(router: APIRouter) -> APIRouter:
    """Every ``/api/runs/{run}/X`` route of ``router`` once more as ``/api/run/X?run=NAME``.

    No path can carry a run named "." or "..": browsers and HTTP clients remove such segments
    (even spelled %2E%2E) before the request leaves. A query parameter carries any name.
    The handlers are the same functions: without ``{run}`` in the path, FastAPI reads the
    ``run`` argument from the query string.
    """
    aliases = APIRouter(prefix="/api", tags=["api"])
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        for prefix in RUN_PATH_PREFIXES:
            if route.path.startswith(prefix):
                assert route.methods is not None  # an APIRoute's are set (GET by default)
                aliases.add_api_route(
                    "/run/" + route.path.removeprefix(prefix),
                    route.endpoint,
                    methods=sorted(route.methods),
                    summary=f"{route.summary} (run name in ?run=, for any name)",
                    response_class=route.response_class,
                )
    return aliases
