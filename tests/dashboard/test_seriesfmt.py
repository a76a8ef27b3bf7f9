"""The series route's binary format against its JSON, through the app over a real store."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.store.columns import SeriesColumns, empty_band
from rankwatch.dashboard import seriesfmt
from rankwatch.dashboard.app import create_app
from rankwatch.dashboard.jsonenc import parse_finite

from .conftest import BASE_URL, Records, feed_shifted_run, settle


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    with TestClient(create_app(AggregatorProvider(aggregator)), base_url=BASE_URL) as c:
        yield c


def both(client: TestClient, run: str, **params: Any) -> tuple[dict, dict]:
    """The JSON body and the decoded binary body of one query."""
    url = f"/api/runs/{run}/series"
    as_json = client.get(url, params=params)
    as_bin = client.get(url, params={**params, "format": "bin"})
    assert as_json.status_code == as_bin.status_code == 200
    assert as_bin.headers["content-type"] == seriesfmt.MEDIA_TYPE
    return as_json.json(), seriesfmt.decode(as_bin.content)


def floats(values: list[Any]) -> list[float | None]:
    return [parse_finite(v) for v in values]


def assert_same(body: dict, binary: dict) -> None:
    assert {k: v for k, v in body.items() if k not in ("series", "band")} == {
        k: v for k, v in binary.items() if k not in ("series", "band")
    }
    assert list(body["series"]) == list(binary["series"])
    for rank, data in body["series"].items():
        assert list(data) == list(binary["series"][rank])
        for field in data:
            np.testing.assert_array_equal(floats(data[field]), binary["series"][rank][field])
    for field, values in body["band"].items():
        np.testing.assert_array_equal(floats(values), binary["band"][field])


def test_binary_equals_json(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)
    for params in ({}, {"start": 10, "end": 30}, {"max_points": 10}, {"view": "band"}):
        body, binary = both(client, "msrun4", metric="loss", **params)
        assert_same(body, binary)
    assert len(binary["band"]["step"]) == 60  # band view: the band and the outliers only
    assert list(binary["series"]) == [str(r) for r in binary["outliers"]] == ["2"]
    assert binary["mode"] == "band" and binary["ranks_total"] == 4
    body, binary = both(client, "msrun4", metric="loss", minmax="false")
    assert_same(body, binary)
    assert list(body["series"]["0"]) == ["step", "value"]  # what the page draws, no more


def test_binary_keeps_nonfinite_values(client: TestClient, aggregator: Any, recs: Records) -> None:
    aggregator.add([
        recs.step("nan", 0, 1, 2, loss=1.0),
        recs.step("nan", 1, 1, 2, loss=1.1),
        recs.step("nan", 0, 2, 2, loss=math.nan),
        recs.step("nan", 1, 2, 2, loss=math.inf),
        recs.step("nan", 0, 3, 2, loss=-math.inf),
        recs.step("nan", 1, 3, 2, loss=1.2),
    ])  # fmt: skip
    settle(aggregator)
    body, binary = both(client, "nan", metric="loss")
    assert body["series"]["0"]["value"] == [1.0, "NaN", "-Infinity"]
    assert_same(body, binary)
    values = binary["series"]["1"]["value"].tolist()
    assert values == [1.1, math.inf, 1.2]


def test_errors_stay_json(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)
    res = client.get("/api/runs/msrun4/series", params={"metric": "nope", "format": "bin"})
    assert res.status_code == 404 and "no metric" in res.json()["detail"]
    res = client.get("/api/runs/msrun4/series", params={"metric": "loss", "format": "xml"})
    assert res.status_code == 422


def test_layout_is_aligned_and_self_describing() -> None:
    cols = SeriesColumns.from_rows(np.array([3, 3, 8]), np.array([1, 2, 1]), np.array([0.5, 1, 2]))
    for run in ("r", "rr", "a longer run name"):  # every header length pads to 8 bytes
        body = bytes(seriesfmt.encode({"run": run}, cols, empty_band()))
        assert body[:4] == b"RWS1"
        (size,) = struct.unpack_from("<I", body, 4)
        assert (8 + size) % 8 == 0
        header = json.loads(body[8 : 8 + size])
        assert header["series"] == {"ranks": [3, 8], "counts": [2, 1]}
        assert header["columns"][:2] == [["series.step", 3], ["series.value", 3]]
        assert len(body) == 8 + size + 8 * (4 * 3 + 6 * 0)
        floats = np.frombuffer(body, "<f8", offset=8 + size)
        assert floats[:3].tolist() == [1.0, 2.0, 1.0] and floats[3:6].tolist() == [0.5, 1.0, 2.0]
        assert seriesfmt.decode(body)["run"] == run
    with pytest.raises(ValueError, match="magic"):
        seriesfmt.decode(b"{}")
