"""The dashboard's HTTP API. Reads only ``Aggregator.snapshot()``, ``.store``, ``.alerts`` and
``.feed`` (and ``.add`` for ``POST /api/ingest``).

Store queries block (DuckDB), so the routes that touch the store are plain ``def``: FastAPI
runs them in its thread pool and the event loop keeps serving the live stream meanwhile.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse
from rankwatch.agent import records

from . import prom, views
from .jsonenc import StrictJSONResponse

DEFAULT_MAX_POINTS = 2000  # per rank, before the store's min/max downsampling
MAX_MAX_POINTS = 20_000
DEFAULT_HEATMAP_BUCKETS = 120  # step columns of the divergence heatmap
MAX_HEATMAP_BUCKETS = 600
ALERT_HISTORY_LIMIT = 200
MAX_INGEST_BYTES = 64 * 1024 * 1024  # one POST /api/ingest body
MAX_INGEST_RECORDS = 200_000
MAX_REPORTED_ERRORS = 50  # per-record errors echoed back in full; the rest are only counted

api = APIRouter(prefix="/api", tags=["api"])
ops = APIRouter(tags=["operations"])

Ranks = Annotated[str | None, Query(description="Selected ranks, e.g. '0,3,8-11'", max_length=4000)]
Step = Annotated[int | None, Query(description="First/last step of the window (inclusive)")]


def _agg(request: Request) -> Any:
    return request.app.state.aggregator


def _queries(request: Request) -> threading.Lock:
    """Held around every store query. DuckDB's Python client (2.0.1) imports modules lazily on
    a process's first ``fetchnumpy``, and two threads doing that first fetch at once deadlock
    (seen here, reproducible in a few lines); the page loads its charts in parallel. Queries
    take milliseconds, so one at a time costs little."""
    return request.app.state.store_queries


def _json(content: Any) -> StrictJSONResponse:
    # Returning a response skips FastAPI's own encoding, which would turn NaN into null
    # and walk every point of a series once more.
    return StrictJSONResponse(content)


def _bad(message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=message)


def _require_run(agg: Any, run: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The snapshot and the run's entry in it; 404 when neither the store nor the live state
    knows the run."""
    snapshot = agg.snapshot()
    entry = views.find_run(snapshot, run)
    if entry is None and all(r.get("run") != run for r in agg.store.runs()):
        raise HTTPException(status_code=404, detail=f"unknown run {run!r}")
    return snapshot, entry


def _require_metric(agg: Any, run: str, entry: dict[str, Any] | None, metric: str) -> None:
    if metric not in _metrics(agg, run, entry):
        raise HTTPException(status_code=404, detail=f"run {run!r} has no metric {metric!r}")


def _metrics(agg: Any, run: str, entry: dict[str, Any] | None) -> set[str]:
    """Stored metrics plus those only live so far (seen, not flushed to the store yet)."""
    names = set(agg.store.metrics(run))
    for rank in (entry or {}).get("ranks") or []:
        names.update(rank.get("values") or {})
    return names


def _parse_ranks(text: str | None) -> list[int]:
    try:
        return views.parse_ranks(text)
    except ValueError as exc:
        raise _bad(f"ranks: {exc}") from None


def _check_window(start: int | None, end: int | None) -> None:
    if start is not None and end is not None and end < start:
        raise _bad(f"end ({end}) is before start ({start})")


def _alerted(agg: Any, run: str) -> list[tuple[int | None, str | None]]:
    seen = [*agg.alerts.firing(), *agg.alerts.history(ALERT_HISTORY_LIMIT)]
    out: list[tuple[int | None, str | None]] = []
    for alert in seen:
        if alert.run == run:
            # a grouped alert (rank None) lists its ranks; the first few are worth a line
            group = getattr(alert, "ranks", ())[: views.MAX_OUTLIER_RANKS]
            out.extend((rank, alert.metric) for rank in (group or (alert.rank,)))
    return out


@api.get("/runs", summary="Every run: live state, world size, ranks, start, last record")
def list_runs(request: Request) -> StrictJSONResponse:
    agg = _agg(request)
    now = time.time()
    snapshot = agg.snapshot(now=now)
    runs = views.merge_runs(agg.store.runs(), snapshot)
    return _json({"now": snapshot.get("now", now), "runs": runs})


@api.get("/runs/{run:path}/metrics", summary="Metric names a run has logged, in chart order")
def run_metrics(request: Request, run: str) -> StrictJSONResponse:
    agg = _agg(request)
    _, entry = _require_run(agg, run)
    return _json({"run": run, "metrics": views.order_metrics(_metrics(agg, run, entry))})


@api.get("/runs/{run:path}/series", summary="One metric of a run, every rank or band + outliers")
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
) -> StrictJSONResponse:
    agg = _agg(request)
    _check_window(start, end)
    selected = _parse_ranks(ranks)
    _, entry = _require_run(agg, run)
    _require_metric(agg, run, entry, metric)
    total = views.rank_count(entry)
    band_mode = view == "band" or (view == "auto" and total > views.BAND_THRESHOLD_RANKS)
    outliers = views.outlier_ranks(entry, metric, _alerted(agg, run))
    wanted = sorted({*outliers, *selected}) if band_mode else None
    series: dict[int, dict[str, list]] = {}
    with _queries(request):
        if wanted or not band_mode:
            series = agg.store.series(
                run, metric, ranks=wanted, start=start, end=end, max_points=max_points
            )
        band = agg.store.band(run, metric, start=start, end=end, max_points=max_points)
    if total == 0:
        total = len(series)
    return _json(
        {
            "run": run,
            "metric": metric,
            "mode": "band" if band_mode else "ranks",
            "start": start,
            "end": end,
            "max_points": max_points,
            "ranks_total": total,
            "selected": selected,
            "outliers": outliers,
            "series": {str(rank): data for rank, data in sorted(series.items())},
            "band": band,
        }
    )


@api.get("/runs/{run:path}/heatmap", summary="Robust z per rank per step bucket (heatmap)")
def run_heatmap(
    request: Request,
    run: str,
    metric: Annotated[str, Query(min_length=1, max_length=records.MAX_NAME_CHARS)],
    start: Step = None,
    end: Step = None,
    buckets: Annotated[int, Query(ge=2, le=MAX_HEATMAP_BUCKETS)] = DEFAULT_HEATMAP_BUCKETS,
) -> StrictJSONResponse:
    agg = _agg(request)
    _check_window(start, end)
    _, entry = _require_run(agg, run)
    _require_metric(agg, run, entry, metric)
    with _queries(request):
        series = agg.store.series(run, metric, start=start, end=end, max_points=buckets)
    steps, width, grid = views.bucket_series(series, buckets)
    z = views.robust_z_columns(grid, len(steps))
    ranks = sorted(z)
    return _json(
        {
            "run": run,
            "metric": metric,
            "steps": steps,
            "width": width,
            "ranks": ranks,
            "z": [z[rank] for rank in ranks],
        }
    )


@api.get("/runs/{run:path}/divergence", summary="Active divergences and latest z per rank")
def run_divergence(request: Request, run: str) -> StrictJSONResponse:
    agg = _agg(request)
    _, entry = _require_run(agg, run)
    entry = entry or {}
    return _json(
        {
            "run": run,
            "divergences": entry.get("divergences") or [],
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


@api.get("/runs/{run:path}/ranks", summary="The rank table: health, last values, z-scores")
def run_ranks(request: Request, run: str) -> StrictJSONResponse:
    agg = _agg(request)
    snapshot, entry = _require_run(agg, run)
    entry = entry or {}
    return _json(
        {
            "run": run,
            "now": snapshot.get("now", time.time()),
            "state": entry.get("state"),
            "world_size": entry.get("world_size"),
            "ranks": entry.get("ranks") or [],
        }
    )


@api.get("/runs/{run:path}/events", summary="Start, end, crash, pause ... events of a run")
def run_events(request: Request, run: str) -> StrictJSONResponse:
    agg = _agg(request)
    _require_run(agg, run)
    with _queries(request):
        events = agg.store.events(run)
    return _json({"run": run, "events": events})


@api.get("/alerts", summary="Alerts firing now and the recent history")
def list_alerts(
    request: Request,
    run: Annotated[str | None, Query(max_length=records.MAX_NAME_CHARS)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = ALERT_HISTORY_LIMIT,
) -> StrictJSONResponse:
    engine = _agg(request).alerts
    firing = [a for a in engine.firing() if run is None or a.run == run]
    history = [a for a in engine.history(limit) if run is None or a.run == run]
    return _json({"firing": firing, "history": history})


@api.get("/status", summary="Aggregator.snapshot(): what `rankwatch status` prints")
def status(request: Request) -> StrictJSONResponse:
    return _json(_agg(request).snapshot())


INGEST_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["records"],
                "properties": {
                    "records": {
                        "type": "array",
                        "items": {"type": "object"},
                        "description": 'wire records (agent/records.py); NaN as "NaN"',
                    }
                },
            }
        }
    },
}


@api.post(
    "/ingest",
    summary="Records as JSON (what `rankwatch import --url` sends)",
    openapi_extra={"requestBody": INGEST_BODY},
)
async def ingest(request: Request) -> StrictJSONResponse:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_INGEST_BYTES:
        raise HTTPException(413, f"body over {MAX_INGEST_BYTES} bytes: send smaller batches")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_INGEST_BYTES:
            raise HTTPException(413, f"body over {MAX_INGEST_BYTES} bytes: send smaller batches")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise _bad(f"body is not JSON: {exc}") from None
    raw = payload.get("records") if isinstance(payload, dict) else None
    if not isinstance(raw, list):
        raise _bad('body must be a JSON object {"records": [record, ...]}')
    if len(raw) > MAX_INGEST_RECORDS:
        raise HTTPException(413, f"{len(raw)} records in one request, max {MAX_INGEST_RECORDS}")
    return await run_in_threadpool(_decode_and_add, _agg(request), raw)


def _decode_and_add(agg: Any, raw: list[Any]) -> StrictJSONResponse:
    """Decode each record on its own so one bad line costs only itself, then add the rest."""
    good: list[records.Record] = []
    errors: list[dict[str, Any]] = []
    by_reason: dict[str, int] = {}
    for index, item in enumerate(raw):
        try:
            good.append(records.decode_record(item))
        except records.DecodeError as exc:
            by_reason[exc.reason] = by_reason.get(exc.reason, 0) + 1
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append({"index": index, "reason": exc.reason, "error": str(exc)})
    result = agg.add(good) if good else None
    return _json(
        {
            "received": len(raw),
            "accepted": len(good),
            "rejected": len(raw) - len(good),
            "errors": errors,
            "errors_by_reason": by_reason,
            "result": result,
        }
    )


@api.get("/stream", summary="Server-Sent Events: live increments (points, ranks, alerts ...)")
async def stream(
    request: Request,
    run: Annotated[str | None, Query(max_length=records.MAX_NAME_CHARS)] = None,
) -> StreamingResponse:
    hub = request.app.state.live
    return StreamingResponse(
        hub.stream(run),
        media_type="text/event-stream",
        # no-transform and X-Accel-Buffering keep reverse proxies from holding events back.
        headers={"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"},
    )


@ops.get("/healthz", summary="Liveness: the process answers", include_in_schema=True)
async def healthz() -> StrictJSONResponse:
    return _json({"ok": True})


@ops.get("/metrics", summary="Prometheus text exposition", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    agg = _agg(request)
    body = prom.render(agg.snapshot(), agg.counters(), len(agg.alerts.firing()))
    return PlainTextResponse(body, media_type=prom.CONTENT_TYPE)
