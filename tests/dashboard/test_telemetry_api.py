"""The telemetry API and /metrics over a real Aggregator and store (TestClient)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.agent.wire.records import MAX_NAME_CHARS, TelemetryRecord
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import create_app

from .conftest import BASE_URL, settle

RANKS = 40  # past the 32 ranks a chart draws one by one


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    with TestClient(create_app(AggregatorProvider(aggregator)), base_url=BASE_URL) as c:
        yield c


def feed(agg: Any, samples: int = 8) -> None:
    t0 = time.time() - 10 * samples
    for i in range(samples):
        recs = []
        for rank in range(RANKS):
            npu = rank >= 32  # the last node runs Ascend cards
            kind = "npu" if npu else "gpu"
            values = {
                f"{kind}/temp_c": 95.0 if rank == 13 else 60.0 + rank % 4,
                ("npu/aicore_pct" if npu else "gpu/util_pct"): 90.0,
                ("npu/hbm_used_bytes" if npu else "gpu/mem_used_bytes"): 32 * 2**30,
            }
            t = t0 + 10 * i + rank * 0.1
            recs.append(TelemetryRecord("hw", rank, i + 1, t, f"node{rank // 8}", 100, kind,
                                        f"{kind}:{rank % 8}", values, {}))  # fmt: skip
        agg.add(recs, imported=False)
        agg.tick()
    settle(agg)


def test_the_cards_now_grouped_by_node(client: TestClient, aggregator: Any) -> None:
    feed(aggregator)
    body = client.get("/api/run/telemetry", params={"run": "hw"}).json()
    assert [m["name"] for m in body["metrics"]][:2] == ["gpu/temp_c", "npu/temp_c"]
    assert body["nodes"]["node1"] == list(range(8, 16)) and len(body["nodes"]) == 5
    row = body["ranks"]["13"]
    assert (row["temp"], row["util"], row["mem"], row["device"]) == (
        95.0,
        90.0,
        32 * 2**30,
        "gpu:5",
    )
    assert row["flags"] == ["gpu/temp_c"]
    assert [(f["rule"], f["rank"]) for f in body["findings"]] == [("hw_hot", 13)]
    assert body["leaders"][0]["rank"] == 13 and body["leaders"][0]["word"] == "hottest"


def test_one_metric_band_and_outliers(client: TestClient, aggregator: Any) -> None:
    feed(aggregator)
    body = client.get("/api/run/telemetry", params={"run": "hw", "metric": "gpu/temp_c"}).json()
    assert body["mode"] == "band" and body["unit"] == "°C" and body["outliers"] == [13]
    assert list(body["series"]) == ["13"] and len(body["series"]["13"]["value"]) == 8
    assert body["band"]["median"] and max(body["band"]["max"]) == 95.0
    every = client.get(
        "/api/run/telemetry", params={"run": "hw", "metric": "gpu/temp_c", "view": "ranks"}
    ).json()
    assert len(every["series"]) == 32 and every["band"] is None
    missing = client.get("/api/run/telemetry", params={"run": "hw", "metric": "gpu/nope"})
    assert missing.status_code == 404 and "has no telemetry metric 'gpu/nope'" in missing.text
    bad = client.get("/api/run/telemetry", params={"run": "hw", "start": 5, "end": 1})
    assert bad.status_code == 422
    # one `metric` parameter for the telemetry, the rank table and the node map: a name longer
    # than the wire takes is refused by each, saying which parameter
    long = "m" * (MAX_NAME_CHARS + 1)
    for path in ("telemetry", "ranks", "nodes"):
        got = client.get(f"/api/run/{path}", params={"run": "hw", "metric": long, "page": 1})
        assert got.status_code == 422 and '"metric"' in got.text, (path, got.text)
    spec = client.get("/openapi.json").json()["paths"]
    for path in ("telemetry", "ranks", "nodes"):
        params = spec[f"/api/runs/{{run}}/{path}"]["get"]["parameters"]
        (schema,) = [p["schema"] for p in params if p["name"] == "metric"]
        assert schema["anyOf"][0]["maxLength"] == MAX_NAME_CHARS, (path, schema)


def test_metrics_speaks_dcgm_and_npu_exporter(client: TestClient, aggregator: Any) -> None:
    feed(aggregator)
    text = client.get("/metrics").text
    assert ('DCGM_FI_DEV_GPU_TEMP{gpu="5",device="nvidia5",Hostname="node1",run="hw",rank="13"} '
            "95.0") in text  # fmt: skip
    assert (
        'DCGM_FI_DEV_FB_USED{gpu="0",device="nvidia0",Hostname="node0",run="hw",rank="0"} 32768.0'
        in text
    )
    assert 'npu_chip_info_temperature{id="1",Hostname="node4",run="hw",rank="33"} 61.0' in text
    assert (
        'npu_chip_info_hbm_used_memory{id="1",Hostname="node4",run="hw",rank="33"} 32768.0' in text
    )
    assert (
        'rankwatch_telemetry{run="hw",rank="0",name="gpu/temp_c",device="gpu:0",'
        'Hostname="node0"} 60.0' in text
    )
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text


def test_export_through_the_server_carries_the_telemetry(
    client: TestClient, aggregator: Any
) -> None:
    feed(aggregator, samples=2)
    res = client.get("/api/run/export", params={"run": "hw", "what": "telemetry"})
    assert res.status_code == 200 and res.headers["x-rankwatch-rows"] == str(2 * RANKS * 3)
    assert res.text.splitlines()[0] == "run,rank,inc,time,source,device,name,value"
