"""The paged rank table and the node map: the pure part table-driven, the routes through the app
over a real Aggregator and store (a live run, and a stored run written through the Store)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.aggregator import history
from rankwatch.aggregator.provider import AggregatorProvider, z_columns, z_step
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.snapshot import stored_rank_entry
from rankwatch.dashboard import ranktable
from rankwatch.dashboard.app import create_app

from .bigrun import BigRun, fill
from .conftest import BASE_URL, Records, feed_shifted_run


def entry(rank: int, state: str = "running", host: str = "", **kw: Any) -> dict[str, Any]:
    return {"rank": rank, "state": state, "host": host or f"n{rank // 4}", "last_step": 10,
            "values": {}, "z": {}, "divergent": [], **kw}  # fmt: skip


# 12 ranks on 3 nodes: each kind of odd rank once, the others ok with a spread of z
ENTRIES = [
    entry(0, z={"loss": 0.1}, values={"loss": 1.0}),
    entry(1, z={"loss": 3.5}, values={"loss": 1.4}),  # far, not flagged
    entry(2, "stalled", z={"loss": -0.2}, values={"loss": 0.9}),
    entry(3, z={"loss": 9.0}, values={"loss": 3.0}, divergent=["loss"]),  # flagged
    entry(4, "crashed", values={"loss": math.nan}),
    entry(5, z={"loss": -1.0}, values={"loss": 0.8}),
    entry(6, z={"loss": 0.5}, values={"loss": 1.1}),  # the culprit (an incident names it)
    entry(7, z={"loss": 0.2}, values={"loss": 1.05}),  # affected
    entry(8, "lost", last_step=None),
    entry(9, z={"loss": 2.0}, values={"loss": 1.2}),
    entry(10, z={"loss": -4.0}, values={"loss": 0.5}),  # far, low side
    entry(11, "finished", z={"loss": 0.0}, values={"loss": 1.0}),
]
ROLES = {6: "culprit", 7: "affected"}


def rows() -> list[dict[str, Any]]:
    return ranktable.rows_of(reversed(ENTRIES), "loss", ROLES)  # any order in, rank order out


def page_ranks(**query: str) -> list[int]:
    got = ranktable.select(rows(), ranktable.parse_query(**query))
    return [r["rank"] for r in got["rows"]]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # odd first (culprit, crashed, flagged, affected, stalled), then far, then ok; by rank
        ({}, [6, 4, 3, 7, 2, 8, 1, 10, 0, 5, 9, 11]),
        ({"sort": "rank", "desc": "1"}, list(range(11, -1, -1))),
        ({"sort": "z"}, [3, 10, 1, 9, 5, 6, 2, 7, 0, 11, 4, 8]),  # |z|, missing last
        ({"sort": "value", "desc": "0"}, [10, 5, 2, 0, 11, 7, 6, 9, 1, 3, 4, 8]),  # NaN last
        ({"sort": "state"}, [4, 11, 8, 0, 1, 3, 5, 6, 7, 9, 10, 2]),
        ({"sort": "last_step", "desc": "1"}, [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 8]),
        ({"filter": "odd"}, [6, 4, 3, 7, 2, 8]),
        ({"filter": "crashed"}, [4]),
        ({"filter": "flagged"}, [3]),
        ({"filter": "culprit"}, [6]),
        ({"filter": "3-5", "sort": "rank"}, [3, 4, 5]),
        ({"filter": "7"}, [7]),
        ({"filter": "N2", "sort": "rank"}, [8, 9, 10, 11]),  # part of a host, any case
        ({"host": "n1", "sort": "rank"}, [4, 5, 6, 7]),
        ({"host": "n1", "filter": "odd"}, [6, 4, 7]),
        ({"filter": "nothing"}, []),
        ({"size": "5", "page": "2"}, [8, 1, 10, 0, 5]),
        ({"size": "5", "page": "99"}, [9, 11]),  # past the last page: the last page
    ],
)
def test_sort_filter_page(query: dict[str, str], expected: list[int]) -> None:
    assert page_ranks(**query) == expected


def test_totals_say_what_every_page_says() -> None:
    got = ranktable.select(rows(), ranktable.parse_query(size="5", page="2", filter="odd"))
    assert (got["total"], got["matched"], got["pages"], got["page"]) == (12, 6, 2, 2)
    assert (got["first"], got["last"]) == (6, 6)
    assert got["counts"] == {"running": 8, "stalled": 1, "crashed": 1, "lost": 1, "finished": 1}
    assert got["levels"] == {"ok": 4, "far": 2, "stalled": 2, "affected": 1, "flagged": 1,
                             "crashed": 1, "culprit": 1}  # fmt: skip
    assert got["odd"] == 6
    assert got["divergent"] == [{"rank": 3, "divergent": ["loss"]}]
    kept: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    query = ranktable.parse_query(sort="z")
    first = ranktable.select(rows(), query, orders=kept)
    assert list(kept) == [("z", True)]
    assert ranktable.select(rows(), query, orders=kept)["rows"] == first["rows"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"sort": "loss"}, "sort: 'loss' is not one of attention, rank"),
        ({"desc": "down"}, "desc: 'down' is not 1 or 0"),
        ({"page": "two"}, "page: 'two' is not a whole number"),
        ({"page": "0"}, "page: 0 is not between 1 and"),
        ({"size": "1001"}, "size: 1001 is not between 1 and 1,000"),
        ({"filter": "9-3"}, "filter: the rank range '9-3' ends before it starts"),
        ({"filter": "x" * 201}, "filter: at most 200 characters"),
    ],
)
def test_bad_query_says_why(query: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        ranktable.parse_query(**query)


def test_node_cells_by_host_then_by_block() -> None:
    cells = ranktable.node_cells(rows())
    assert (cells["by"], cells["cells"], cells["ranks"]) == ("host", 3, 12)
    assert cells["name"] == ["n0", "n1", "n2"]
    assert [cells["levels"][lv] for lv in cells["level"]] == ["flagged", "culprit", "stalled"]
    assert cells["worst"] == [3, 6, 8]
    assert cells["z"] == [9.0, 1.0, 4.0]
    assert (cells["first"], cells["last"], cells["count"]) == ([0, 4, 8], [3, 7, 11], [4, 4, 4])
    # Too many hosts for the map, or a rank without one: blocks of consecutive ranks.
    for folded in (
        ranktable.node_cells(rows(), max_cells=2),
        ranktable.node_cells(
            ranktable.rows_of([*ENTRIES[:11], {**entry(11), "host": None}], "loss", {})
        ),
    ):
        assert folded["by"] == "block" and folded["block"] == ranktable.MIN_BLOCK_RANKS
        assert folded["name"] == ["ranks 0–7", "ranks 8–11"]
        assert folded["count"] == [8, 4]
    assert ranktable.node_cells([])["cells"] == 0


def test_roles_from_the_incident_that_matters_now() -> None:
    resolved = {"state": "resolved", "culprits": [1], "affected": [2], "terminated": []}
    firing = {"state": "firing", "culprits": [5], "affected": [6], "terminated": [5, 7]}
    assert ranktable.roles_of([resolved, firing]) == {5: "culprit", 6: "affected", 7: "terminated"}
    assert list(ranktable.roles_of([firing])) == [5, 6, 7]  # culprits first
    assert ranktable.roles_of([resolved]) == {1: "culprit", 2: "affected"}
    assert ranktable.roles_of([]) == {}


def test_z_step_is_the_heatmaps_one_column_z() -> None:
    values = {r: 1.0 + 0.01 * math.sin(r * 1.7) for r in range(300)}
    values[17] = 1.3
    values[40] = math.nan
    one = z_columns({r: [v] for r, v in values.items()}, 1, "loss")
    got = z_step(values, "loss")
    assert got.keys() == values.keys()
    for rank, z in got.items():
        want = one[rank][0]
        assert want is not None
        assert (math.isnan(z) and math.isnan(want)) or z == want
    assert got[17] > 6
    assert z_step({}) == {}


# --- through the app --------------------------------------------------------------------------


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    with TestClient(create_app(AggregatorProvider(aggregator)), base_url=BASE_URL) as c:
        yield c


def test_live_run_paged(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)  # rank 2 flagged on loss
    body = client.get("/api/runs/msrun4/ranks", params={"page": 1, "size": 2}).json()
    assert body["live"] is True and body["metric"] == "loss"
    assert (body["total"], body["matched"], body["pages"]) == (4, 4, 2)
    assert [r["rank"] for r in body["rows"]] == [2, 0]
    assert body["rows"][0]["flagged"] and body["rows"][0]["z"] > 3
    assert body["divergent"] == [{"rank": 2, "divergent": ["loss"]}]
    got = client.get("/api/run/ranks", params={"run": "msrun4", "sort": "rank", "desc": 1})
    assert [r["rank"] for r in got.json()["rows"]] == [3, 2, 1, 0]
    nodes = client.get("/api/run/nodes", params={"run": "msrun4"}).json()
    assert (nodes["by"], nodes["name"], nodes["worst"]) == ("host", ["node0"], [2])
    assert nodes["levels"][nodes["level"][0]] == "culprit"  # the run's incident names it
    # without paging parameters: the whole table, as before
    assert len(client.get("/api/runs/msrun4/ranks").json()["ranks"]) == 4


BAD_REQUESTS = [
    ("/api/runs/msrun4/ranks", {"page": "x"}, 400, "page: 'x' is not a whole number"),
    ("/api/runs/msrun4/ranks", {"sort": "nope"}, 400, "sort: 'nope' is not one of"),
    ("/api/runs/msrun4/ranks", {"size": "5000"}, 400, "size: 5000 is not between"),
    ("/api/runs/msrun4/ranks", {"page": 1, "metric": "nope"}, 404, "has no metric 'nope'"),
    ("/api/runs/nope/ranks", {"page": 1}, 404, "unknown run"),
    ("/api/runs/nope/nodes", {}, 404, "unknown run"),
]


def test_bad_requests_say_why(client: TestClient, aggregator: Any, recs: Records) -> None:
    feed_shifted_run(aggregator, recs)
    for path, params, status, detail in BAD_REQUESTS:
        res = client.get(path, params=params)
        assert res.status_code == status, (path, params, res.text)
        assert detail in res.json()["detail"], (path, params)


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[tuple[TestClient, BigRun, Aggregator]]:
    data = tmp_path / "stored"
    big, _ = fill(data, world=300, steps=3, hosts_world=16)
    agg = Aggregator(ServeConfig(data_dir=data, ingest_host="127.0.0.1", ingest_port=0,
                                 console_alerts=False, resend_gaps=False))  # fmt: skip
    try:
        with TestClient(create_app(AggregatorProvider(agg)), base_url=BASE_URL) as c:
            yield c, big, agg
    finally:
        agg.stop()


def test_stored_run_table_chart_and_map(
    stored: tuple[TestClient, BigRun, Aggregator], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, big, agg = stored
    run = {"run": big.run}
    built: list[int] = []  # the stored ranks whose entries were built

    def counted(row: Any, life: str | None) -> dict[str, Any]:
        built.append(row["rank"])
        return stored_rank_entry(row, life)

    monkeypatch.setattr(history, "stored_rank_entry", counted)
    listed = client.get("/api/runs").json()["runs"]
    assert {r["run"]: r["ranks"] for r in listed}[big.run] == big.world
    assert built == []  # the run list counts the ranks, it builds no entry of one
    status = client.get("/api/status").json()
    shown = [rank["rank"] for r in status["runs"] for rank in r.get("ranks") or []]
    assert sorted(built) == sorted(shown)  # status: those it lists (a big run: some of them)
    (listed_run,) = [r for r in status["runs"] if r["run"] == big.run]
    assert len(listed_run["ranks"]) == history.MAX_LISTED_RANKS < big.world
    built.clear()
    body = client.get("/api/run/ranks", params={**run, "page": 1}).json()
    assert sorted(built) == sorted(r["rank"] for r in body["rows"])  # the page's alone
    assert body["live"] is False and body["total"] == big.world
    assert [r["rank"] for r in body["rows"][:4]] == [big.culprit, big.crashed, *big.affected]
    culprit = body["rows"][0]
    assert culprit["role"] == "culprit" and culprit["z"] > 6  # the detector's z of its value
    assert math.isclose(
        culprit["value"], agg.store.series(big.run, "loss")[big.culprit]["value"][-1]
    )
    by_z = client.get("/api/run/ranks", params={**run, "sort": "z", "size": 1}).json()
    assert by_z["rows"][0]["rank"] == big.culprit
    # A stored run of many ranks is a band, with the incident's ranks drawn over it.
    series = client.get("/api/run/series", params={**run, "metric": "loss"}).json()
    assert series["mode"] == "band" and series["ranks_total"] == big.world
    assert series["outliers"][:3] == [big.culprit, *big.affected]
    assert sorted(series["series"]) == sorted(str(r) for r in (big.culprit, *big.affected))
    nodes = client.get("/api/run/nodes", params=run).json()
    assert (nodes["by"], nodes["cells"]) == ("block", math.ceil(big.world / 8))
    i = nodes["worst"].index(big.culprit)
    assert nodes["levels"][nodes["level"][i]] == "culprit"
    ranks, values = agg.store.latest_values(big.run, "loss")
    assert ranks.tolist() == list(range(big.world)) and values.shape == (big.world,)
    assert agg.store.latest_values(big.run, "nope")[0].size == 0
