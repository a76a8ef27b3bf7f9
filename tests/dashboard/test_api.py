"""The HTTP API through the app, over a real Aggregator and a real DuckDB store in tmp_path."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.agent.wire.records import to_wire
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import create_app

from .conftest import BASE_URL, Records, feed_shifted_run, settle


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    with TestClient(create_app(AggregatorProvider(aggregator)), base_url=BASE_URL) as c:
        yield c


def strict(text: str) -> Any:
    """Parse as RFC 8259 JSON: a bare NaN or Infinity token fails the test."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))


def test_runs_lists_live_state_and_history(
    client: TestClient, aggregator: Any, recs: Records
) -> None:
    feed_shifted_run(aggregator, recs)
    body = strict(client.get("/api/runs").text)
    assert isinstance(body["now"], float)
    (run,) = body["runs"]
    assert run["run"] == "msrun4"
    assert run["world_size"] == 4
    assert run["ranks"] == 4
    assert run["last_step"] == 60
    assert run["start"] is not None and run["last_time"] >= run["start"]
    assert run["state"] in ("running", "stalled", "lost")
    assert run["divergences"] >= 1  # rank 2 is flagged by now


def test_metrics_in_chart_order(client: TestClient, aggregator: Any, recs: Records) -> None:
    aggregator.add([recs.step("r", 0, 1, 1, zeta=1.0, lr=0.1, loss_aux=2.0, loss=3.0)])
    settle(aggregator)
    assert client.get("/api/runs/r/metrics").json()["metrics"] == ["loss", "loss_aux", "lr", "zeta"]


def test_series_every_rank_and_band(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)
    body = strict(client.get("/api/runs/msrun4/series", params={"metric": "loss"}).text)
    assert body["mode"] == "ranks"
    assert body["ranks_total"] == 4
    assert sorted(body["series"]) == ["0", "1", "2", "3"]
    for data in body["series"].values():
        assert data["step"] == list(range(1, 61))
        assert len(data["value"]) == len(data["min"]) == len(data["max"]) == 60
    assert body["band"]["step"] == list(range(1, 61))
    # from step 20 rank 2 sits far above the cross-rank median
    i = body["band"]["step"].index(40)
    assert body["series"]["2"]["value"][i] > 2 * body["band"]["median"][i]
    assert 2 in body["outliers"]


def test_series_window_and_downsampling(client: TestClient, aggregator: Any, recs: Records) -> None:
    batch = []
    for step in range(1, 2001):
        spike = 50.0 if step == 777 else 0.0
        batch += [recs.step("long", r, step, 2, loss=1.0 + r + spike * (r == 1)) for r in (0, 1)]
    aggregator.add(batch)
    settle(aggregator)
    body = client.get("/api/runs/long/series", params={"metric": "loss", "max_points": 100}).json()
    for data in body["series"].values():
        assert len(data["step"]) <= 100
    assert max(body["series"]["1"]["value"]) == 52.0  # min/max downsampling keeps the spike
    window = client.get(
        "/api/runs/long/series", params={"metric": "loss", "start": 700, "end": 800}
    ).json()
    assert window["series"]["0"]["step"] == list(range(700, 801))


def test_series_band_mode_past_32_ranks(client: TestClient, aggregator: Any, recs: Records) -> None:
    world, bad = 40, 17
    batch = []
    for step in range(1, 41):
        for rank in range(world):
            value = 1.0 + 0.01 * ((rank * 7 + step) % 5)
            batch.append(
                recs.step(
                    "big", rank, step, world, loss=value * (3 if rank == bad and step > 10 else 1)
                )
            )
    aggregator.add(batch)
    settle(aggregator)
    body = client.get("/api/runs/big/series", params={"metric": "loss", "ranks": "3,5"}).json()
    assert body["mode"] == "band"
    assert body["ranks_total"] == world
    assert bad in body["outliers"]
    assert sorted(int(r) for r in body["series"]) == sorted({bad, 3, 5})
    assert body["selected"] == [3, 5]
    assert len(body["band"]["median"]) == 40
    every = client.get("/api/runs/big/series", params={"metric": "loss", "view": "ranks"}).json()
    assert every["mode"] == "ranks" and len(every["series"]) == world


def test_nonfinite_values_travel_as_strings(
    client: TestClient, aggregator: Any, recs: Records
) -> None:
    aggregator.add([
        recs.step("nan", 0, 1, 2, loss=1.0),
        recs.step("nan", 1, 1, 2, loss=1.1),
        recs.step("nan", 0, 2, 2, loss=math.nan),
        recs.step("nan", 1, 2, 2, loss=math.inf),
        recs.step("nan", 0, 3, 2, loss=-math.inf),
        recs.step("nan", 1, 3, 2, loss=1.2),
    ])  # fmt: skip
    settle(aggregator)
    res = client.get("/api/runs/nan/series", params={"metric": "loss"})
    body = strict(res.text)
    assert body["series"]["0"]["value"] == [1.0, "NaN", "-Infinity"]
    assert body["series"]["1"]["value"] == [1.1, "Infinity", 1.2]
    ranks = strict(client.get("/api/runs/nan/ranks").text)["ranks"]
    assert {r["rank"]: r["values"]["loss"] for r in ranks} == {0: "-Infinity", 1: 1.2}
    strict(client.get("/api/status").text)
    strict(client.get("/api/runs/nan/heatmap", params={"metric": "loss"}).text)


@pytest.mark.parametrize(
    ("path", "params", "status", "says"),
    [
        ("/api/runs/nope/series", {"metric": "loss"}, 404, "unknown run 'nope'"),
        ("/api/runs/msrun4/series", {"metric": "nope"}, 404, "no metric 'nope'"),
        ("/api/runs/msrun4/series", {"metric": "loss", "ranks": "x"}, 422, "ranks:"),
        ("/api/runs/msrun4/series", {"metric": "loss", "start": 9, "end": 3}, 422, "before"),
        ("/api/runs/msrun4/series", {"metric": "loss", "max_points": 1}, 422, "max_points"),
        ("/api/runs/msrun4/series", {}, 422, "metric"),
        ("/api/runs/nope/ranks", {}, 404, "unknown run"),
        ("/api/runs/msrun4/heatmap", {"metric": "loss", "buckets": 100000}, 422, "buckets"),
    ],
)
def test_bad_requests_say_why(
    client: TestClient,
    aggregator: Any,
    recs: Records,
    path: str,
    params: dict[str, Any],
    status: int,
    says: str,
) -> None:
    feed_shifted_run(aggregator, recs)
    res = client.get(path, params=params)
    assert res.status_code == status
    assert says in json.dumps(res.json()["detail"])


def test_run_names_with_slashes_and_markup(
    client: TestClient, aggregator: Any, recs: Records
) -> None:
    name = "team/exp 1 <img src=x onerror=alert(1)>"
    aggregator.add([recs.step(name, 0, 1, 1, loss=1.0)])
    settle(aggregator)
    from urllib.parse import quote

    res = client.get(f"/api/runs/{quote(name, safe='')}/series", params={"metric": "loss"})
    assert res.status_code == 200
    assert res.json()["run"] == name


def test_heatmap_finds_the_bad_rank(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)
    body = client.get("/api/runs/msrun4/heatmap", params={"metric": "loss", "buckets": 60}).json()
    assert body["ranks"] == [0, 1, 2, 3]
    assert body["width"] == 1 and body["steps"] == list(range(1, 61))
    z = {rank: row for rank, row in zip(body["ranks"], body["z"], strict=True)}
    late = slice(25, 60)  # steps 26..60, well after the fault
    assert min(z[2][late]) > 3
    for rank in (0, 1, 3):
        assert max(abs(v) for v in z[rank][late]) < 3
    # The fault colour's cells: the detector's flag, rank 2 from step 20 on, no one else.
    flagged = dict(zip(body["ranks"], body["flagged"], strict=True))
    assert [s for s, f in zip(body["steps"], flagged[2], strict=True) if f] == list(range(20, 61))
    assert not any(any(flagged[rank]) for rank in (0, 1, 3))
    assert body["last_step"] == 60
    series = client.get("/api/runs/msrun4/series", params={"metric": "loss"}).json()
    assert (series["unit"], series["nonnegative"]) == ("", True)


def test_divergence_ranks_and_alerts_name_rank_2(
    client: TestClient, aggregator: Any, recs: Records
) -> None:
    feed_shifted_run(aggregator, recs)
    div = client.get("/api/runs/msrun4/divergence").json()
    assert {(d["rank"], d["metric"]) for d in div["divergences"]} == {(2, "loss")}
    ranks = client.get("/api/runs/msrun4/ranks").json()
    assert ranks["world_size"] == 4
    by_rank = {r["rank"]: r for r in ranks["ranks"]}
    assert by_rank[2]["divergent"] == ["loss"]
    assert by_rank[2]["z"]["loss"] > 3
    assert by_rank[0]["divergent"] == []
    assert by_rank[1]["host"] == "node0"
    alerts = client.get("/api/alerts", params={"run": "msrun4"}).json()
    firing = [a for a in alerts["firing"] if a["metric"] == "loss"]
    assert [a["rank"] for a in firing] == [2]
    assert firing[0]["since_step"] >= 20 and firing[0]["message"]
    assert client.get("/api/alerts", params={"run": "other"}).json()["firing"] == []


def test_events_route(client: TestClient, aggregator: Any, recs: Records) -> None:
    aggregator.add([
        recs.step("ev", 0, 5, 1, loss=1.0),
        recs.event("ev", 0, "crash", 5, 1, exc_type="RuntimeError", message="boom"),
    ])  # fmt: skip
    settle(aggregator)
    (event,) = client.get("/api/runs/ev/events").json()["events"]
    assert event["event"] == "crash" and event["step"] == 5 and event["rank"] == 0


def test_status_is_the_snapshot(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)
    body = client.get("/api/status").json()
    assert [r["run"] for r in body["runs"]] == ["msrun4"]
    assert len(body["runs"][0]["ranks"]) == 4


def test_ingest_decodes_each_record_and_counts_errors(
    client: TestClient, aggregator: Any, recs: Records
) -> None:
    good = [to_wire(recs.step("imp", r, 1, 2, loss=1.0 + r)) for r in (0, 1)]
    nan = to_wire(recs.step("imp", 0, 2, 2, loss=0.0))
    nan["metrics"] = {"loss": "NaN"}
    bad_kind = {**good[0], "kind": "bogus"}
    missing = {k: v for k, v in good[1].items() if k != "step"}
    res = client.post("/api/ingest", json={"records": [*good, nan, bad_kind, missing]})
    assert res.status_code == 200
    body = res.json()
    assert body["received"] == 5 and body["accepted"] == 3 and body["rejected"] == 2
    assert [e["index"] for e in body["errors"]] == [3, 4]
    assert "'kind'" in body["errors"][0]["error"]
    assert "'step'" in body["errors"][1]["error"]
    assert body["errors_by_reason"] == {"field": 2}
    assert body["result"] == 3  # Aggregator.add: how many were new
    settle(aggregator)
    series = client.get("/api/runs/imp/series", params={"metric": "loss"}).json()["series"]
    assert series["0"]["value"] == [1.0, "NaN"]
    again = client.post("/api/ingest", json={"records": good}).json()
    assert again["result"] == 0  # duplicates of what came before


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "records"),
        (b'{"records": 3}', "records"),
    ],
)
def test_ingest_rejects_bad_bodies(client: TestClient, body: bytes, says: str) -> None:
    res = client.post("/api/ingest", content=body, headers={"content-type": "application/json"})
    assert res.status_code == 422
    assert says in res.json()["detail"]


def test_prometheus_metrics(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs, run='odd"run\\name')
    res = client.get("/metrics")
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = res.text
    label = 'run="odd\\"run\\\\name"'
    assert f'rankwatch_rank_divergent{{{label},rank="2",metric="loss"}} 1.0' in text
    assert f'rankwatch_metric_last{{{label},rank="0",metric="lr"}} 0.01' in text
    assert f"rankwatch_run_world_size{{{label}}} 4.0" in text
    assert "rankwatch_aggregator_records_accepted 244.0" in text
    assert "# TYPE rankwatch_divergence_z gauge" in text


def test_page_static_and_docs(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="/static/app.js">' in page.text
    assert "//" not in page.text.replace("://", "")  # no protocol-relative (CDN) URLs
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert client.get("/static/vendor/echarts.min.js").status_code == 200
    docs = client.get("/docs")
    assert "/static/vendor/swagger-ui-bundle.js" in docs.text and "cdn" not in docs.text
    assert "/api/runs/{run}/series" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    "path",
    ["/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static//etc/passwd"],
)
def test_static_files_stay_in_their_folder(client: TestClient, path: str) -> None:
    res = client.get(path)
    assert res.status_code == 404
    assert "create_app" not in res.text


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"ok": True}
