"""A run of more ranks than SUMMARY_RANKS through the real app, aggregator and store:
``/api/status``, ``/metrics`` and ``/api/runs/{run}/divergence`` give its counts by state and
its odd ranks, not every rank, and the first of its active divergences with their count;
``offset``/``limit`` page through all ranks; ``rankwatch status`` prints the summary."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankwatch.agent.wire.records import EventRecord, StepRecord
from rankwatch.aggregator.alerts.console import DIVERGENCES_PRINTED, render_status
from rankwatch.aggregator.divergence.listing import SHOWN
from rankwatch.aggregator.provider import SUMMARY_RANKS, AggregatorProvider
from rankwatch.dashboard.app import create_app

from tests.nancascade import cascade_step

from .conftest import BASE_URL

RANKS = SUMMARY_RANKS + 476  # 1,500
LOST, CRASHED, GAPPED = 7, 9, 11


@pytest.fixture
def client(aggregator: Any) -> Iterator[TestClient]:
    with TestClient(create_app(AggregatorProvider(aggregator)), base_url=BASE_URL) as c:
        yield c


def feed(agg: Any) -> None:
    now = time.time()

    def rec(rank: int, seq: int, step: int) -> StepRecord:
        return StepRecord("big", rank, seq, now, RANKS, f"node{rank // 8}", 100 + rank, step,
                          0, {"loss": 1.0 + rank % 5 * 1e-3, "lr": 0.1})  # fmt: skip

    agg.add([rec(LOST, 1, 1)], imported=False, now=now - 30)  # silent for 30 s: lost
    for step in (1, 2):
        agg.add(
            [rec(r, step + 2 * (r == GAPPED and step == 2), step)  # seqs 2, 3 missing
             for r in range(RANKS) if r != LOST],
            imported=False, now=now,
        )  # fmt: skip
    crash = EventRecord("big", CRASHED, 3, now, RANKS, "node1", 100 + CRASHED, "crash", 2,
                        {"exc_type": "RuntimeError", "message": "NCCL timeout"})  # fmt: skip
    agg.add([crash], imported=False, now=now)
    agg.tick(now)


def test_a_big_run_is_summarised_and_paged(client: TestClient, aggregator: Any) -> None:
    stream = aggregator.feed.subscribe()
    feed(aggregator)
    tables = [m for m in stream.drain() if m.get("type") == "ranks"]
    # the stream carries the big run's counts, not a table of every rank (the page reads pages)
    assert tables and all("ranks" not in m and m["summary"] for m in tables)
    assert tables[-1]["ranks_seen"] == RANKS and tables[-1]["rank_states"]["alive"] == RANKS - 2
    t = time.perf_counter()
    (run,) = client.get("/api/status").json()["runs"]
    assert time.perf_counter() - t < 1.0
    assert run["ranks_summarised"] is True and run["ranks_seen"] == RANKS
    assert run["rank_states"] == {"alive": RANKS - 2, "lost": 1, "crashed": 1}
    assert run["state"] == "crashed" and run["world_size"] == RANKS and run["last_step"] == 2
    # the odd ranks only, as full entries: crashed, lost, then the one missing a record
    assert [r["rank"] for r in run["ranks"]] == [LOST, CRASHED, GAPPED]
    assert run["ranks_odd"] == 3
    assert {r["rank"]: r["state"] for r in run["ranks"]} == {
        LOST: "lost", CRASHED: "crashed", GAPPED: "alive"}  # fmt: skip
    assert next(r for r in run["ranks"] if r["rank"] == GAPPED)["gaps"] == [[2, 3]]

    pages = [client.get("/api/status", params={"run": "big", "offset": o, "limit": 1000})
             for o in (0, 1000)]  # fmt: skip
    listed = [r["rank"] for p in pages for r in p.json()["runs"][0]["ranks"]]
    assert listed == list(range(RANKS))
    assert pages[1].json()["runs"][0]["ranks_offset"] == 1000
    too_big = client.get("/api/status", params={"limit": 10**6})
    assert too_big.status_code == 422

    text = client.get("/metrics").text
    assert f'rankwatch_run_ranks{{run="big",state="alive"}} {RANKS - 2}' in text
    assert 'rankwatch_run_ranks{run="big",state="lost"} 1' in text
    states = [line for line in text.splitlines() if line.startswith("rankwatch_rank_state{")]
    assert len(states) == 3  # per-rank series of the odd ranks only

    table = render_status(client.get("/api/status").json())
    assert f"ranks: {RANKS - 2:,} alive, 1 lost, 1 crashed" in table
    assert f"({RANKS - 3:,} more ranks not listed: alive, not divergent, nothing missing; " \
        "--run big --all lists every rank)" in table  # fmt: skip
    assert len(table.splitlines()) < 20


def test_a_big_run_with_nothing_to_say_is_one_line_of_counts() -> None:
    run = {"run": "big", "state": "running", "world_size": 5000, "ranks": [],
           "ranks_summarised": True, "ranks_seen": 5000,
           "rank_states": {"alive": 5000}}  # fmt: skip
    lines = render_status({"runs": [run]}, now=0.0).splitlines()
    assert lines[1:] == [
        "  ranks: 5,000 alive",
        "  (every rank alive, not divergent, nothing missing; --run big --all lists every rank)",
    ]


def test_a_big_runs_odd_ranks_follow_a_gap_at_once(client: TestClient, aggregator: Any) -> None:
    """The odd ranks are kept between reads (a sort of every odd rank at 100,000): a gap that
    opens or closes shows in the next read, not a digest's second later."""
    feed(aggregator)

    def odd() -> list[int]:
        (run,) = client.get("/api/status").json()["runs"]
        return [r["rank"] for r in run["ranks"]]

    assert odd() == [LOST, CRASHED, GAPPED]
    assert odd() == [LOST, CRASHED, GAPPED]  # asked again: the same
    now = time.time()
    rec = StepRecord("big", GAPPED, 2, now, RANKS, "node1", 100 + GAPPED, 1, 0, {"loss": 1.0})
    later = StepRecord("big", 13, 5, now, RANKS, "node1", 113, 3, 0, {"loss": 1.0})  # 3, 4 lost
    aggregator.add([rec, dataclasses.replace(rec, seq=3), later], imported=False, now=now)
    assert odd() == [LOST, CRASHED, 13]


def test_a_big_runs_divergence_lists_its_odd_ranks_and_pages_the_rest(
    client: TestClient, aggregator: Any
) -> None:
    # /divergence of 100,000 ranks built every rank's entry under the ingest lock for seconds;
    # it lists ranks as /api/status does
    bad, rng = 20, random.Random(3)
    now = time.time()
    for step in range(1, 13):
        recs = [
            StepRecord("big", r, step, now, RANKS, f"node{r // 8}", 100 + r, step, 0,
                       {"loss": (3.0 if r == bad and step >= 5 else 1.0) * rng.gauss(1, 0.05)})
            for r in range(RANKS)
        ]  # fmt: skip
        aggregator.add(recs, imported=False, now=now)
        aggregator.tick(now)
    div = client.get("/api/runs/big/divergence").json()
    assert {(d["rank"], d["metric"]) for d in div["divergences"]} == {(bad, "loss")}
    assert div["ranks_summarised"] is True and div["ranks_seen"] == RANKS
    assert [r["rank"] for r in div["ranks"]] == [bad] and div["ranks_odd"] == 1
    assert div["ranks"][0]["divergent"] == ["loss"] and div["ranks"][0]["z"]["loss"] > 10
    pages = [client.get("/api/runs/big/divergence", params={"offset": o, "limit": 1000}).json()
             for o in (0, 1000)]  # fmt: skip
    assert [r["rank"] for p in pages for r in p["ranks"]] == list(range(RANKS))
    assert pages[1]["ranks_offset"] == 1000 and pages[1]["ranks_summarised"] is False
    assert client.get("/api/runs/big/divergence", params={"limit": 10**6}).status_code == 422
    assert client.get("/api/runs/nosuch/divergence").status_code == 404


def test_a_nan_cascade_lists_the_card_that_started_it_and_counts_every_other(
    client: TestClient, aggregator: Any
) -> None:
    # After one card's NaN every rank is NaN a step later: each of them is an active
    # divergence on each metric. A summary listed them all (92 MB at 100,000 ranks, seconds
    # under the ingest lock): it lists the first to start and counts the rest.
    first, metrics = 1234, ("loss", "grad_norm")  # past the 100 odd ranks a summary lists
    now = time.time()
    for step in range(1, 9):
        recs = cascade_step("big", step, RANKS, first, 7, metrics, now)
        aggregator.add(recs, imported=False, now=now)
        aggregator.tick(now)
    every = 2 * RANKS
    status = client.get("/api/status")
    (run,) = status.json()["runs"]
    assert run["divergences_active"] == every
    assert run["divergences_by_kind"] == {"nonfinite": every}
    assert len(run["divergences"]) == SHOWN
    assert [(d["rank"], d["since_step"]) for d in run["divergences"][:3]] == [
        (first, 7), (first, 7), (0, 8)]  # fmt: skip
    assert {d["metric"] for d in run["divergences"][:2]} == set(metrics)
    assert len(status.content) < 300_000  # every divergence listed: well over 700 KB
    # every rank is odd (divergent): the one that started it is among the ranks listed
    assert run["ranks_divergent"] == RANKS and run["ranks_odd"] == RANKS
    listed = [r["rank"] for r in run["ranks"]]
    assert first in listed and listed[:3] == [0, 1, 2] and len(listed) < RANKS
    div = client.get("/api/runs/big/divergence").json()
    assert div["divergences"] == run["divergences"] and div["divergences_active"] == every
    assert div["divergences_by_kind"] == {"nonfinite": every}
    page = client.get("/api/runs/big/divergence", params={"offset": 1000, "limit": 10}).json()
    assert [(r["rank"], r["divergent"]) for r in page["ranks"]] == [
        (r, sorted(metrics)) for r in range(1000, 1010)]  # fmt: skip
    prom = client.get("/metrics").text
    assert f'rankwatch_run_divergences{{run="big"}} {every}' in prom
    text = render_status(client.get("/api/status").json(), now=now)
    assert f"  ranks: {RANKS:,} alive; {RANKS:,} divergent" in text.splitlines()
    assert text.count("  ! rank ") == DIVERGENCES_PRINTED
    assert text.splitlines()[-1] == (
        f"  ! {every - DIVERGENCES_PRINTED:,} more active divergences, not listed "
        f"({every:,} nonfinite in all): the earliest to start are above"
    )
    assert f"  ! rank {first} grad_norm nonfinite since step 7" in text
