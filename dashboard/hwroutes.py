"""``GET /api/runs/{run}/telemetry`` (and ``/api/run/telemetry?run=``): the hardware section's
reads, on the API router of ``routes.py`` (registered when ``app.py`` imports this module)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import HTTPException, Query, Request

from . import views
from .jsonenc import StrictJSONResponse
from .routes import (
    MAX_MAX_POINTS,
    Ranks,
    _bad,
    _json,
    _parse_ranks,
    _provider,
    _require_run,
    api,
    metric_query,
)


@api.get("/runs/{run:run}/telemetry", summary="Hardware telemetry: the cards now, or a series")
def run_telemetry(
    request: Request,
    run: str,
    metric: Annotated[
        str | None,
        metric_query("one telemetry metric's series over time; without: the cards now"),
    ] = None,
    start: Annotated[float | None, Query(description="Unix seconds")] = None,
    end: Annotated[float | None, Query(description="Unix seconds")] = None,
    max_points: Annotated[int, Query(ge=10, le=MAX_MAX_POINTS)] = views.TELEMETRY_POINTS,
    ranks: Ranks = None,
    view: Annotated[
        Literal["auto", "ranks", "band"],
        Query(description="auto: every rank up to 32 ranks, band + outliers beyond"),
    ] = "auto",
) -> StrictJSONResponse:
    provider = _provider(request)
    if start is not None and end is not None and end < start:
        raise _bad(f"end ({end}) is before start ({start})")
    selected = _parse_ranks(ranks)
    _require_run(provider, run)
    names = provider.list_telemetry(run)
    hardware = provider.hardware(run)
    if metric is None:
        return _json({**hardware, "metrics": [views.telemetry_entry(n) for n in names]})
    if metric not in names:
        have = ", ".join(names[:20]) or "none yet"
        raise HTTPException(404, f"run {run!r} has no telemetry metric {metric!r} (it has: {have})")
    total = len(hardware["ranks"])
    band_mode = view == "band" or (view == "auto" and total > views.BAND_THRESHOLD_RANKS)
    shown = views.telemetry_shown(hardware, metric, selected) if band_mode else None
    series = provider.read_telemetry(run, metric, ranks=shown, start=start, end=end,
                                     max_points=max_points) if shown != [] else {}  # fmt: skip
    band = (
        provider.read_telemetry_band(run, metric, start=start, end=end, max_points=max_points)
        if band_mode else None
    )  # fmt: skip
    return _json({
        "run": run, "metric": metric, **views.telemetry_entry(metric),
        "mode": "band" if band_mode else "ranks", "ranks_total": total, "selected": selected,
        "outliers": hardware["outliers"].get(metric, []),
        "z": {str(k): v for k, v in hardware["z"].get(metric, {}).items()},
        "nodes": hardware["nodes"], "series": {str(k): v for k, v in series.items()},
        "band": band,
    })  # fmt: skip
