"""``POST /api/ingest``: records as JSON (what ``rankwatch import --url`` sends).

The HTTP twin of the ZeroMQ receiver, and held to the same rule: any body, however broken,
gets a clear 4xx answer naming the problem and is counted (``IngestCounts``, exported on
``/metrics``), never a 500. Each record is decoded on its own, so one bad record costs only
itself. Parsing and decoding run in the thread pool: a 64 MB body must not stall the event loop
that serves the live stream.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from rankwatch.agent.wire import records
from rankwatch.aggregator.provider import DataProvider

from .jsonenc import StrictJSONResponse

MAX_INGEST_BYTES = 64 * 1024 * 1024  # one POST /api/ingest body
MAX_INGEST_RECORDS = 200_000
MAX_REPORTED_ERRORS = 50  # per-record errors echoed back in full; the rest are only counted
# Why a whole body was refused (the ``kind`` label of the counter): over the size or record
# limit, not JSON, nested deeper than the JSON parser goes, not {"records": [...]}.
BODY_REASONS = ("size", "json", "depth", "shape", "count")

ingest_api = APIRouter(prefix="/api", tags=["api"])

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


class IngestCounts:
    """What ``POST /api/ingest`` took and refused; thread-safe (handlers run in a pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.records = 0  # records decoded and handed to the aggregator ...
        self.accepted = 0  # ... of them new
        self.duplicates = 0  # ... of them already held (a resend, an import run twice)
        self.bad_bodies: dict[str, int] = dict.fromkeys(BODY_REASONS, 0)
        self.bad_records: dict[str, int] = {}

    def arrived(self) -> None:
        with self._lock:
            self.requests += 1

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.bad_bodies[reason] = self.bad_bodies.get(reason, 0) + 1

    def took(self, decoded: int, new: int, by_reason: dict[str, int]) -> None:
        with self._lock:
            self.records += decoded
            self.accepted += new
            self.duplicates += decoded - new
            for reason, count in by_reason.items():
                self.bad_records[reason] = self.bad_records.get(reason, 0) + count

    def counters(self) -> dict[str, Any]:
        """Aggregator.counters() shape: flat numbers, or one level of {kind: number}."""
        with self._lock:
            return {
                "http_ingest_requests": self.requests,
                "http_ingest_records": self.records,
                "http_ingest_accepted": self.accepted,
                "http_ingest_duplicates": self.duplicates,
                "http_ingest_bad_bodies": dict(self.bad_bodies),
                "http_ingest_bad_records": dict(self.bad_records),
            }


def ingest_counts(request: Request) -> IngestCounts:
    return request.app.state.ingest_counts


def _refuse(counts: IngestCounts, reason: str, status: int, message: str) -> HTTPException:
    counts.refuse(reason)
    return HTTPException(status_code=status, detail=message)


@ingest_api.post(
    "/ingest",
    summary="Records as JSON (what `rankwatch import --url` sends)",
    openapi_extra={"requestBody": INGEST_BODY},
)
async def ingest(request: Request) -> StrictJSONResponse:
    counts = ingest_counts(request)
    counts.arrived()
    too_big = f"body over {MAX_INGEST_BYTES} bytes: send smaller batches"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_INGEST_BYTES:
        raise _refuse(counts, "size", 413, too_big)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_INGEST_BYTES:
            raise _refuse(counts, "size", 413, too_big)
    return await run_in_threadpool(_parse_and_add, request.app.state.provider, counts, body)


def _parse_and_add(
    provider: DataProvider, counts: IngestCounts, body: bytearray
) -> StrictJSONResponse:
    try:
        payload = json.loads(body)
    except RecursionError:
        # CPython's parser recurses once per nested list or map and gives up near the
        # interpreter's recursion limit; without this the request would end in a 500.
        raise _refuse(
            counts,
            "depth",
            422,
            "body is nested too deeply to parse (lists or maps inside each other about a "
            "thousand levels down): a record is a flat map, and event info may nest at most "
            f"{records.MAX_INFO_DEPTH} levels",
        ) from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes not UTF-8
        raise _refuse(counts, "json", 422, f"body is not JSON: {exc}") from None
    raw = payload.get("records") if isinstance(payload, dict) else None
    if not isinstance(raw, list):
        raise _refuse(counts, "shape", 422, 'body must be a JSON object {"records": [record, ...]}')
    if len(raw) > MAX_INGEST_RECORDS:
        raise _refuse(
            counts, "count", 413, f"{len(raw)} records in one request, max {MAX_INGEST_RECORDS}"
        )
    return _decode_and_add(provider, counts, raw)


def _decode_and_add(
    provider: DataProvider, counts: IngestCounts, raw: list[Any]
) -> StrictJSONResponse:
    """Decode each record on its own so one bad record costs only itself, then add the rest."""
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
    new = provider.ingest(good) if good else 0
    counts.took(len(good), new, by_reason)
    return StrictJSONResponse(
        {
            "received": len(raw),
            "accepted": new,
            "duplicates": len(good) - new,
            "rejected": len(raw) - len(good),
            "errors": errors,
            "errors_by_reason": by_reason,
            "result": new,
        }
    )
