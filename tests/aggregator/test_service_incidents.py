"""Incidents through the wired aggregator: a NaN that the all-reduce spreads to every rank is
one incident whose culprit is the rank that went first; it reaches the live feed, the API,
`rankwatch status`, /metrics and the console, and it is still there after a restart."""

from __future__ import annotations

import io
import math
import time
from dataclasses import replace
from pathlib import Path

from fastapi.testclient import TestClient
from rankwatch.agent.wire.records import EventRecord, StepRecord
from rankwatch.aggregator.alerts.console import render_status
from rankwatch.aggregator.alerts.sinks.console import ConsoleSink
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.dashboard.app import create_app

BASE_URL = "http://127.0.0.1"  # the app answers to IP addresses and localhost
WORLD = 4
RUN = "nanjob"


def step(rank: int, s: int, loss: float, t: float, world: int = WORLD) -> StepRecord:
    return StepRecord(
        run=RUN, rank=rank, seq=s, time=t, world_size=world, host=f"node{rank // 2}",
        pid=100 + rank, step=s, epoch=0, metrics={"loss": loss},
    )  # fmt: skip


def feed_nan_spread(
    agg: Aggregator, culprit: int = 2, fault: int = 20, steps: int = 30, world: int = WORLD
) -> None:
    """``culprit`` goes NaN at ``fault``; every rank is NaN from the next step (the all-reduce)."""
    t0 = time.time() - steps
    for s in range(1, steps + 1):
        batch = []
        for rank in range(world):
            bad = (rank == culprit and s >= fault) or s > fault
            loss = math.nan if bad else 2.0 / (1 + 0.05 * s) + 0.01 * (rank % 7)
            batch.append(step(rank, s, loss, t0 + s + 1e-6 * rank, world))
        agg.add(batch, imported=False, now=t0 + s)
        agg.tick(now=t0 + s + 0.5)


def config(tmp_path: Path) -> ServeConfig:
    return ServeConfig(data_dir=tmp_path / "data", console_alerts=False)


def test_a_spread_nan_is_one_incident_with_the_first_rank_as_culprit(tmp_path: Path) -> None:
    agg = Aggregator(config(tmp_path))
    out = io.StringIO()
    agg.sinks.append(ConsoleSink(out))
    sub = agg.feed.subscribe()
    feed_nan_spread(agg)
    (inc,) = agg.incidents.incidents(RUN)
    assert inc.cause == "nonfinite"
    assert inc.culprits == (2,)
    assert set(inc.affected) == {0, 1, 3}
    assert inc.step == 20
    assert any(e.step == 20 and e.rank == 2 for e in inc.timeline)
    messages = sub.drain(100_000)
    opened = [m for m in messages if m.get("type") == "incident" and m["change"] == "opened"]
    assert opened and opened[0]["run"] == RUN and opened[0]["incident"]["culprits"] == [2]
    console = out.getvalue()
    assert "[INCIDENT] nanjob: rank 2" in console
    assert console.count("[INCIDENT]") == 1  # one message for the fault, not one per rank

    snapshot = agg.snapshot()
    text = render_status(snapshot)
    assert text.startswith(f"INCIDENT {inc.id}: {inc.summary}")
    client = TestClient(create_app(AggregatorProvider(agg)), base_url=BASE_URL)
    body = client.get("/api/run/incidents", params={"run": RUN}).json()
    assert [i["culprits"] for i in body["incidents"]] == [[2]]
    metrics = client.get("/metrics").text
    assert f'rankwatch_run_incidents_open{{run="{RUN}"}} 1' in metrics
    agg.stop()


def test_incidents_outlive_the_process(tmp_path: Path) -> None:
    agg = Aggregator(config(tmp_path))
    feed_nan_spread(agg)
    (inc,) = agg.incidents.incidents(RUN)
    agg.flush_store()
    agg.stop()

    again = Aggregator(config(tmp_path))  # a new `serve` over the same store: no live state
    try:
        assert again.incidents.incidents(RUN) == []
        (stored,) = again.incidents_of(RUN)
        assert (stored["id"], stored["culprits"], stored["cause"]) == (inc.id, [2], "nonfinite")
        # the 3 ranks that followed the culprit at step 21 are one timeline item
        assert [(e["rank"], e["step"], e["count"], e["ranks"]) for e in stored["timeline"]] == [
            (2, 20, 1, []), (0, 21, 3, [[0, 1], [3, 3]]),
        ]  # fmt: skip
        # one stored before items had groups: one rank each
        old = {**stored, "id": f"{RUN}#9", "timeline": [{"step": 20, "time": 1.0, "rank": 2,
                                                        "what": "loss non-finite"}]}  # fmt: skip
        again.store.append_incident(old)
        again.flush_store()
        (_, was) = sorted(again.incidents_of(RUN), key=lambda i: i["id"])
        assert was["timeline"] == [{**old["timeline"][0], "count": 1, "ranks": []}]
        client = TestClient(create_app(AggregatorProvider(again)), base_url=BASE_URL)
        body = client.get(f"/api/runs/{RUN}/incidents").json()
        assert [i["id"] for i in body["incidents"]] == [f"{RUN}#9", inc.id]
        assert body["incidents"][1]["timeline"] == stored["timeline"]
    finally:
        again.stop()


def test_at_a_thousand_ranks_the_grouped_alert_does_not_make_every_rank_a_culprit(
    tmp_path: Path,
) -> None:
    """Past a few ranks the alert engine groups the ranks that went non-finite into one alert
    whose since_step is the earliest rank's: that step must not be given to the whole group."""
    agg = Aggregator(config(tmp_path))
    try:
        feed_nan_spread(agg, culprit=777, steps=24, world=1024)
        (inc,) = agg.incidents.incidents(RUN)
        assert inc.culprits == (777,)
        assert len(inc.affected) == 1023 and 777 not in inc.affected
        assert inc.step == 20
    finally:
        agg.stop()


CRASH = Path(__file__).parents[1] / "fixtures" / "crashes" / "mindspore_allreduce_kernel.txt"
ONE_LINE = "RuntimeError: Launch kernel failed, name:.../AllReduce-op2"


def crash_then_peers(agg: Aggregator, world: int = WORLD) -> None:
    """Rank 1 crashes with a MindSpore kernel error (32 lines) at step 6; the others are
    killed by the launcher (SIGTERM) a second later."""
    t0 = time.time() - 10
    for s in range(1, 6):
        agg.add([step(r, s, 1.0, t0 + s) for r in range(world)], imported=False, now=t0 + s)
        agg.tick(now=t0 + s + 0.5)
    text = CRASH.read_text().split("RuntimeError: ", 1)[1]  # str(exc): the agent's message
    crash = EventRecord(RUN, 1, 6, t0 + 6, world, "node0", 101, "crash", 6,
                        {"exc_type": "builtins.RuntimeError", "message": text})  # fmt: skip
    agg.add([crash], imported=False, now=t0 + 6)
    agg.tick(now=t0 + 6.5)
    ends = [EventRecord(RUN, r, 6, t0 + 7, world, f"node{r // 2}", 100 + r, "end", 5,
                        {"reason": "SIGTERM"}) for r in range(world) if r != 1]  # fmt: skip
    agg.add(ends, imported=False, now=t0 + 7)
    agg.tick(now=t0 + 7.5)


def test_a_crash_message_is_one_line_in_the_table_and_status_and_whole_in_the_api(
    tmp_path: Path,
) -> None:
    agg = Aggregator(config(tmp_path))
    try:
        crash_then_peers(agg)
        client = TestClient(create_app(AggregatorProvider(agg)), base_url=BASE_URL)
        ranks = {r["rank"]: r for r in client.get(f"/api/runs/{RUN}/ranks").json()["ranks"]}
        assert ranks[1]["message_line"] == ONE_LINE
        assert "allreduce_cpu_kernel.cc:62" in ranks[1]["message"]  # the whole text
        assert ranks[0]["message_line"] == ranks[0]["message"] == "finished (SIGTERM)"
        text = render_status(agg.snapshot())
        assert f"  rank 1: {ONE_LINE}" in text.splitlines()
        assert "allreduce_cpu_kernel" not in text
    finally:
        agg.stop()


def test_a_restarted_serve_still_says_where_the_incidents_ranks_ran(tmp_path: Path) -> None:
    agg = Aggregator(config(tmp_path))
    crash_then_peers(agg)
    (inc,) = agg.incidents.incidents(RUN)
    assert (inc.cause, inc.culprits, inc.terminated) == ("crash", (1,), (0, 2, 3))
    agg.stop()  # flushes and closes the store

    again = Aggregator(config(tmp_path))  # a new `serve` over the same files: no live state
    try:
        (stored,) = again.incidents_of(RUN)
        assert stored["terminated"] == [0, 2, 3]  # joined after it opened: stored all the same
        assert stored["hosts"] == {"1": ["node0", 101], "0": ["node0", 100],
                                   "2": ["node1", 102], "3": ["node1", 103]}  # fmt: skip
        client = TestClient(create_app(AggregatorProvider(again)), base_url=BASE_URL)
        (api,) = client.get(f"/api/runs/{RUN}/incidents").json()["incidents"]
        assert api["hosts"]["1"] == ["node0", 101]
        # the job relaunched and a new fault: a new incident, numbered after the stored one
        t0 = time.time()
        for s in range(7, 13):
            batch = [replace(step(r, s, math.nan if r == 2 and s >= 9 else 1.0, t0 + s),
                             pid=200 + r, seq=s - 6) for r in range(4)]  # fmt: skip
            again.add(batch, imported=False, now=t0 + s)
            again.tick(now=t0 + s + 0.5)
        (new,) = again.incidents.incidents(RUN)
        assert (new.id, new.cause, new.culprits) == (f"{RUN}#2", "nonfinite", (2,))
        ids = [i["id"] for i in again.incidents_of(RUN)]
        assert sorted(ids) == [f"{RUN}#1", f"{RUN}#2"]
    finally:
        again.stop()


def test_the_first_message_waits_for_the_evidence_the_api_and_stream_do_not(
    tmp_path: Path,
) -> None:
    agg = Aggregator(config(tmp_path))
    out = io.StringIO()
    agg.sinks.append(ConsoleSink(out))
    sub = agg.feed.subscribe()
    feed_nan_spread(agg, steps=20)  # the tick after step 20 opens it
    (inc,) = agg.incidents.incidents(RUN)
    streamed = [m for m in sub.drain(100_000) if m.get("type") == "incident"]
    assert [m["change"] for m in streamed] == ["opened"]
    assert [i["id"] for i in agg.incidents_of(RUN)] == [inc.id]
    assert "[INCIDENT]" not in out.getvalue()  # held: its evidence may still change
    opened_by = time.time() + 0.5  # feed_nan_spread ticked step 20 before this
    agg.tick(now=opened_by + agg.config.incidents.announce_quiet_s)
    assert out.getvalue().count("[INCIDENT] nanjob: rank 2") == 1
    agg.stop()
