"""POST /api/ingest through the app over a real Aggregator: bodies nested thousands of levels
deep are refused with a 422 naming the problem and counted on /metrics, never a 500, and good
bodies keep going in afterwards."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import create_app

from tests.hardening.procs import parse_prom

from .conftest import BASE_URL

DEEP = 10_000  # lists/maps inside each other: far past CPython's recursion limit
SHALLOW = 500  # parses, but no record field may hold it


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    # A server error must show as the 500 a real client would get, not as a test error.
    with TestClient(
        create_app(AggregatorProvider(aggregator)), base_url=BASE_URL, raise_server_exceptions=False
    ) as c:
        yield c


def step(seq: int, **fields: Any) -> str:
    """One step record as JSON text, with ``fields`` spliced in as raw JSON text."""
    rec = {
        "kind": "step", "run": "deep", "rank": 0, "seq": seq, "time": time.time(),
        "world_size": 1, "host": "h", "pid": 1, "step": seq, "epoch": None,
        "metrics": {"loss": 1.0},
    }  # fmt: skip
    text = json.dumps(rec)[:-1]
    return text + "".join(f', "{k}": {v}' for k, v in fields.items()) + "}"


def event(seq: int, info: str) -> str:
    rec = {
        "kind": "event", "run": "deep", "rank": 0, "seq": seq, "time": time.time(),
        "world_size": 1, "host": "h", "pid": 1, "event": "note", "step": None,
    }  # fmt: skip
    return json.dumps(rec)[:-1] + f', "info": {info}}}'


def lists(depth: int) -> str:
    return "[" * depth + "]" * depth


def maps(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def post_body(*recs: str) -> str:
    return '{"records": [' + ", ".join(recs) + "]}"


def post(client: TestClient, body: str | bytes) -> Any:
    return client.post("/api/ingest", content=body, headers={"content-type": "application/json"})


def bad_bodies(client: TestClient) -> dict[str, float]:
    family = parse_prom(client.get("/metrics").text).get(
        "rankwatch_aggregator_http_ingest_bad_bodies", {}
    )
    return {dict(labels)["kind"]: value for labels, value in family.items()}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(lambda: post_body(step(1, metrics='{"loss": ' + lists(DEEP) + "}")),
                     id="metric-lists"),
        pytest.param(lambda: post_body(step(1, metrics='{"loss": ' + maps(DEEP) + "}")),
                     id="metric-maps"),
        pytest.param(lambda: post_body(event(1, maps(DEEP))), id="event-info"),
        pytest.param(lambda: post_body(step(1, extra=lists(DEEP))), id="unknown-field"),
        pytest.param(lambda: post_body(lists(DEEP)), id="record-itself"),
        pytest.param(lambda: '{"records": ' + lists(DEEP) + "}", id="records-list"),
        pytest.param(lambda: maps(DEEP), id="whole-body"),
    ],
)  # fmt: skip
def test_deep_nesting_is_a_422_that_says_so_and_is_counted(
    client: TestClient, aggregator: Any, body: Any
) -> None:
    res = post(client, body())
    assert res.status_code == 422, res.text[:300]
    assert "nested too deeply" in res.json()["detail"]
    assert bad_bodies(client)["depth"] == 1
    # The serve goes on taking good bodies.
    ok = post(client, post_body(step(2)))
    assert ok.status_code == 200 and ok.json()["accepted"] == 1


def test_nesting_the_parser_takes_costs_only_its_record(client: TestClient) -> None:
    body = post_body(
        step(1, metrics='{"loss": ' + lists(SHALLOW) + "}"),
        event(2, maps(SHALLOW)),
        step(3, extra=maps(SHALLOW)),  # unknown fields are ignored, however deep
        step(4),
    )
    res = post(client, body)
    assert res.status_code == 200, res.text[:300]
    body = res.json()
    assert (body["accepted"], body["rejected"]) == (2, 2)
    errors = {e["index"]: e["error"] for e in body["errors"]}
    assert "metric 'loss' must be a number" in errors[0]
    assert "nested deeper than 32 levels" in errors[1]
    assert bad_bodies(client)["depth"] == 0
    family = parse_prom(client.get("/metrics").text)
    assert family["rankwatch_aggregator_http_ingest_bad_records"][(("kind", "field"),)] == 2
    assert family["rankwatch_aggregator_http_ingest_records"][()] == 2


@pytest.mark.parametrize(
    ("raw", "status", "kind", "says"),
    [
        ("not json", 422, "json", "not JSON"),
        (b"\xff\xfe{}", 422, "json", "not JSON"),
        ("[1, 2]", 422, "shape", "records"),
        ('{"records": 3}', 422, "shape", "records"),
    ],
)
def test_every_refused_body_is_counted_by_kind(
    client: TestClient, raw: str | bytes, status: int, kind: str, says: str
) -> None:
    res = post(client, raw)
    assert res.status_code == status and says in res.json()["detail"]
    counted = bad_bodies(client)
    assert counted[kind] == 1 and sum(counted.values()) == 1


HUGE = "1" + "0" * 400  # a JSON integer no float can hold


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: step(2, metrics='{"loss": ' + HUGE + "}"), id="metric"),
        pytest.param(lambda: step(2, time=HUGE), id="time"),
    ],
)
def test_an_integer_too_large_for_a_float_costs_only_its_record(client: TestClient, bad) -> None:  # type: ignore[no-untyped-def]
    res = post(client, post_body(step(1), bad(), step(3)))
    assert res.status_code == 200, res.text
    out = res.json()
    assert (out["accepted"], out["rejected"]) == (2, 1)
    assert out["errors"][0]["index"] == 1 and out["errors"][0]["reason"] == "field"
    assert "too large for a float" in out["errors"][0]["error"]
    assert client.get("/api/status").status_code == 200


def test_accepted_counts_new_records_and_duplicates_apart(client: TestClient) -> None:
    body = post_body(step(1), step(2))
    first, again = post(client, body).json(), post(client, body).json()
    assert (first["accepted"], first["duplicates"]) == (2, 0)
    assert (again["accepted"], again["duplicates"], again["rejected"]) == (0, 2, 0)
    prom = parse_prom(client.get("/metrics").text)
    assert prom["rankwatch_aggregator_http_ingest_accepted"][()] == 2
    assert prom["rankwatch_aggregator_http_ingest_duplicates"][()] == 2
