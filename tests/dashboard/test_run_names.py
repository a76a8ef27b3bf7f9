"""Every run name the wire accepts is served by every run route, over real HTTP (uvicorn on a
loopback socket, httpx): control characters, line breaks, slashes, dot segments, percent
signs, unicode, spaces. The path form ``/api/runs/{run}/X`` serves every name a path can
carry; ``/api/run/X?run=NAME`` serves every name, "." and ".." included (clients drop those
path segments before the request leaves)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import create_app

from .conftest import Records, settle
from .test_live import serve

NAMES = [
    "\x01run",
    "a\nb",
    "cr\rlf\n",
    "tab\there",
    "a\x00b",
    "team/exp",
    "/lead",
    "trail/",
    "x/../y",
    "../..",
    "..",
    ".",
    "ünï 名前 ✓",
    "sp ace",
    "100%",
    "a%2Fb",
    "?q=1#frag",
    "back\\slash",
    "x/metrics",  # ends like a route
    "\u2028line sep",
    "\x01 team/../exp ünï\n1",  # all at once
]
DOT_SEGMENTS = {".", ".."}  # no URL path can hold them
ROUTES = [
    ("metrics", {}),
    ("series", {"metric": "loss"}),
    ("heatmap", {"metric": "loss"}),
    ("divergence", {}),
    ("ranks", {}),
    ("events", {}),
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from rankwatch.aggregator.service import Aggregator, ServeConfig

    data = tmp_path_factory.mktemp("names") / "data"
    config = ServeConfig(
        data_dir=data, ingest_host="127.0.0.1", ingest_port=0, console_alerts=False,
        resend_gaps=False,
    )  # fmt: skip
    agg = Aggregator(config)
    recs = Records()
    for name in NAMES:
        agg.add([
            recs.event(name, 0, "start", None, 2),
            recs.step(name, 0, 1, 2, loss=1.0),
            recs.step(name, 1, 1, 2, loss=1.5),
        ])  # fmt: skip
    settle(agg)
    try:
        with serve(create_app(AggregatorProvider(agg))) as url:
            yield url
    finally:
        agg.stop()


def check(res: httpx.Response, name: str) -> None:
    assert res.status_code == 200, (name, res.request.url, res.status_code, res.text[:200])
    body: dict[str, Any] = res.json()
    assert body.get("run", name) == name


def test_every_name_is_listed(base_url: str) -> None:
    runs = httpx.get(f"{base_url}/api/runs", timeout=10).json()["runs"]
    assert {r["run"] for r in runs} == set(NAMES)


@pytest.mark.parametrize("name", [n for n in NAMES if n not in DOT_SEGMENTS], ids=ascii)
@pytest.mark.parametrize(("route", "params"), ROUTES, ids=[r for r, _ in ROUTES])
def test_path_form_serves_the_name(
    base_url: str, name: str, route: str, params: dict[str, str]
) -> None:
    url = f"{base_url}/api/runs/{quote(name, safe='')}/{route}"
    res = httpx.get(url, params=params, timeout=10)
    check(res, name)
    if route == "ranks":
        assert sorted(r["rank"] for r in res.json()["ranks"]) == [0, 1]
    if route == "series":
        assert sorted(res.json()["series"]) == ["0", "1"]


@pytest.mark.parametrize("name", NAMES, ids=ascii)
@pytest.mark.parametrize(("route", "params"), ROUTES, ids=[r for r, _ in ROUTES])
def test_query_form_serves_every_name(
    base_url: str, name: str, route: str, params: dict[str, str]
) -> None:
    res = httpx.get(f"{base_url}/api/run/{route}", params={"run": name, **params}, timeout=10)
    check(res, name)
    if route == "series":
        assert sorted(res.json()["series"]) == ["0", "1"]


def test_a_dot_segment_in_a_path_never_reaches_another_route(base_url: str) -> None:
    """What a client sends for a run named "..": the segment is gone, and what is left is an
    unknown route, never another run's data."""
    res = httpx.get(f"{base_url}/api/runs/../ranks", timeout=10)
    assert res.url.path == "/api/ranks" and res.status_code == 404


def test_unknown_names_are_404_in_both_forms(base_url: str) -> None:
    assert httpx.get(f"{base_url}/api/runs/nope%0A/ranks", timeout=10).status_code == 404
    res = httpx.get(f"{base_url}/api/run/ranks", params={"run": "nope\n"}, timeout=10)
    assert res.status_code == 404 and "unknown run" in res.json()["detail"]
    assert httpx.get(f"{base_url}/api/run/ranks", timeout=10).status_code == 422  # run missing
