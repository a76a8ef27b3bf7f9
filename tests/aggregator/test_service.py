"""The wired aggregator: real ZeroMQ, a real store in tmp_path, real agent processes."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import EventRecord, Heartbeat, Record, StepRecord
from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.http import WebhookConfig
from rankwatch.aggregator.service import LIVE_RETENTION_S, Aggregator, ServeConfig
from rankwatch.aggregator.store.db import Store, StoreError

from tests.polling import wait_until

WORLD = 4


def step(rank: int, seq: int, loss: float, run: str = "r1", world: int = WORLD) -> StepRecord:
    return StepRecord(
        run=run, rank=rank, seq=seq, time=time.time(), world_size=world, host=f"node{rank // 2}",
        pid=100 + rank, step=seq, epoch=0, metrics={"loss": loss, "lr": 0.1},
    )  # fmt: skip


def loss_at(rank: int, s: int, bad_rank: int | None = 2, from_step: int = 20) -> float:
    base = 2.0 / (1 + 0.05 * s) + 0.01 * rank
    return base * 3 if rank == bad_rank and s >= from_step else base


def config(tmp_path: Path, **kw: Any) -> ServeConfig:
    kw.setdefault("flush_interval_s", 0.05)
    kw.setdefault("console_alerts", False)
    return ServeConfig(data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0, **kw)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


class Agents:
    """One DEALER per rank; closed at teardown (a socket left to the GC hangs term())."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.socks: dict[int, zmq.Socket] = {}

    def connect(self, port: int, ranks: range = range(WORLD)) -> None:
        for old in self.socks.values():
            old.close(0)
        self.socks = {}
        for rank in ranks:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            self.socks[rank] = sock

    def send(self, recs: list[Record]) -> None:
        self.socks[recs[0].rank].send(records.encode_frame(recs))

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(0)


@pytest.fixture
def agents(ctx: zmq.Context) -> Iterator[Agents]:
    made = Agents(ctx)
    yield made
    made.close()


@pytest.fixture
def agg(tmp_path: Path) -> Iterator[Aggregator]:
    aggregator = Aggregator(config(tmp_path))
    aggregator.start()
    yield aggregator
    aggregator.stop()


def send_steps(agents: Agents, steps: range, ranks: range = range(WORLD), **kw: Any) -> None:
    for s in steps:
        for rank in ranks:
            agents.send([step(rank, s, loss_at(rank, s, **kw))])


class Recorder:
    """An alert sink that keeps what it is given."""

    name = "recorder"

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)

    def snapshot(self) -> dict[str, Any]:
        return {"alerts": len(self.alerts)}

    def close(self, timeout: float = 0.0) -> None:
        pass


def test_divergent_rank_is_flagged_alerted_stored_and_published(
    agg: Aggregator, agents: Agents
) -> None:
    recorder = Recorder()
    agg.sinks.append(recorder)
    seen = recorder.alerts
    sub = agg.feed.subscribe()
    agents.connect(agg.ingest_port)
    send_steps(agents, range(1, 41))
    wait_until(lambda: agg.counters()["records_accepted"] == 40 * WORLD)
    wait_until(lambda: any(a.rule == "divergence" and a.rank == 2 for a in seen))

    snap = agg.snapshot()
    (run,) = snap["runs"]
    assert run["run"] == "r1" and run["state"] == "running" and run["world_size"] == WORLD
    assert run["last_step"] == 40
    by_rank = {r["rank"]: r for r in run["ranks"]}
    assert by_rank[2]["divergent"] == ["loss"]
    assert all(by_rank[r]["divergent"] == [] for r in (0, 1, 3))
    assert by_rank[2]["z"]["loss"] > 3 and abs(by_rank[0]["z"]["loss"]) < 3
    assert by_rank[1]["values"] == {"loss": pytest.approx(loss_at(1, 40)), "lr": 0.1}
    assert by_rank[3]["host"] == "node1" and by_rank[3]["pid"] == 103
    assert run["divergences"][0]["rank"] == 2 and run["divergences"][0]["since_step"] >= 20

    wait_until(lambda: agg.store.runs())
    messages = []
    while (m := sub.get_nowait()) is not None:
        messages.append(m)
    kinds = {m["type"] for m in messages}
    assert {"points", "ranks", "divergence", "alert"} <= kinds
    points = [p for m in messages if m["type"] == "points" and m["metric"] == "loss"
              for p in m["points"]]  # fmt: skip
    assert len(points) == 40 * WORLD and [2, 40, pytest.approx(loss_at(2, 40))] in points
    # the latest table: a tick may stream one before the last ranks' first records are in
    ranks_msg = [m for m in messages if m["type"] == "ranks"][-1]
    assert sorted(r["rank"] for r in ranks_msg["ranks"]) == list(range(WORLD))


def test_malformed_frames_are_counted_and_valid_traffic_keeps_flowing(
    agg: Aggregator, agents: Agents
) -> None:
    agents.connect(agg.ingest_port)
    junk = [b"", b"\xc1", msgpack.packb({"v": 1}), msgpack.packb({"v": 7, "records": []})]
    for s in range(1, 21):
        agents.socks[0].send(junk[s % len(junk)])
        agents.send([step(0, s, 1.0)])
    bad_record = {"kind": "step", "run": "r1", "rank": 1, "seq": "one"}
    agents.socks[1].send(records.encode_frame([records.to_wire(step(1, 1, 1.0)), bad_record]))
    wait_until(lambda: agg.counters()["records_accepted"] == 21)
    counters = agg.counters()
    assert counters["ingest_bad_messages"] == 20 and counters["ingest_bad_records"] == 1
    assert counters["ingest_errors"] == {"msgpack": 10, "envelope": 5, "version": 5, "field": 1}
    assert counters["senders"]["r1/0"]["records"] == 20


def test_duplicates_are_dropped_across_live_traffic_imports_and_restarts(
    tmp_path: Path, agents: Agents
) -> None:
    first = [step(0, s, 1.0) for s in range(1, 11)]
    with Aggregator(config(tmp_path)) as agg:
        agents.connect(agg.ingest_port, range(1))
        agents.send(first)
        agents.send(first[:5])  # an agent resending after a reconnect
        wait_until(lambda: agg.counters()["records_received"] == 15)
        assert agg.add(first[3:]) == 0  # an import of the same records
        assert agg.add([step(0, 11, 1.0)]) == 1
        counters = agg.counters()
        assert counters["records_accepted"] == 11 and counters["records_duplicates"] == 12
    with Aggregator(config(tmp_path)) as agg:  # dedupe state comes back from the store
        agents.connect(agg.ingest_port, range(1))
        agents.send([*first, step(0, 11, 1.0), step(0, 12, 1.0)])
        wait_until(lambda: agg.counters()["records_received"] == 12)
        assert agg.counters()["records_accepted"] == 1
    with Store(tmp_path / "data") as store:
        assert store.seen_seqs() == [("r1", 0, 0, 1, 12)]


def test_a_gap_makes_the_aggregator_ask_the_agent_to_resend(
    agg: Aggregator, agents: Agents
) -> None:
    agents.connect(agg.ingest_port, range(1))
    agents.send([step(0, s, 1.0) for s in (1, 2, 3, 7, 8)])
    sock = agents.socks[0]
    assert sock.poll(5000), "no resend request arrived"
    assert msgpack.unpackb(sock.recv()) == {"v": 1, "resend_from": 4, "run": "r1", "rank": 0}
    agents.send([step(0, s, 1.0) for s in (4, 5, 6)])  # what the agent re-reads from JSONL
    wait_until(lambda: agg.counters()["records_accepted"] == 8)
    assert agg.snapshot()["runs"][0]["ranks"][0]["gaps"] == []


class FlakyStore(Store):
    """A real store whose disk 'fills up' on demand (fault injection, not a fake)."""

    failing = True

    def flush(self) -> None:
        if self.failing:
            raise StoreError(f"cannot write to the store at {self.path}: No space left on device")
        super().flush()


def test_store_failure_is_logged_once_the_live_view_goes_on_and_it_catches_up(
    tmp_path: Path, agents: Agents, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr("rankwatch.aggregator.service.STORE_RETRY_S", 0.1)
    caplog.set_level(logging.WARNING, logger="rankwatch.service")
    store = FlakyStore(tmp_path / "data")
    agg = Aggregator(config(tmp_path), store=store)
    agg.start()
    try:
        agents.connect(agg.ingest_port)
        send_steps(agents, range(1, 11), bad_rank=None)
        wait_until(lambda: agg.counters()["store_errors"] >= 3)
        snap = agg.snapshot()
        assert snap["runs"][0]["last_step"] == 10  # live view unaffected
        assert agg.counters()["store_failing"] == 1
        errors = [r for r in caplog.records if "cannot write the store" in r.getMessage()]
        assert len(errors) == 1 and "No space left" in errors[0].getMessage()
        store.failing = False
        wait_until(lambda: agg.counters()["store_failing"] == 0)
        assert store.runs()[0]["records"] == 10 * WORLD
    finally:
        agg.stop()


class TimedStore(Store):
    """A real store noting when each flush ran; ``arrivals`` are appended right after the
    first one, as records that came in while it was writing."""

    def __init__(self, path: Path, arrivals: list[Record]) -> None:
        super().__init__(path)
        self.arrivals = arrivals
        self.flushes: list[tuple[float, float]] = []

    def flush(self) -> None:
        start = time.monotonic()
        super().flush()
        self.append(self.arrivals)
        self.arrivals = []
        self.flushes.append((start, time.monotonic()))


def test_a_backlog_left_by_a_flush_is_written_at_once_then_the_pause_resumes(
    tmp_path: Path,
) -> None:
    store = TimedStore(tmp_path / "data", [step(0, q, 1.0) for q in range(1, 61)])
    cfg = config(tmp_path, store_flush_s=2.0, store_backlog_records=50)
    agg = Aggregator(cfg, store=store)
    agg.start()
    try:
        wait_until(lambda: len(store.flushes) >= 3, timeout_s=20, what="three flushes")
    finally:
        agg.stop()
    (_, end1), (start2, end2), (start3, _) = store.flushes[:3]
    assert start2 - end1 < 1.0  # 60 records left >= 50: no pause
    assert start3 - end2 >= 1.9  # nothing left: the 2 s pause
    assert store.runs()[0]["records"] == 60


class _Hang(BaseHTTPRequestHandler):
    release = threading.Event()
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.release.wait(10)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_hanging_webhook_does_not_slow_ingest(tmp_path: Path, agents: Agents) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hang)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    hook = WebhookConfig("slack", f"http://127.0.0.1:{httpd.server_address[1]}/x", timeout_s=5)
    agg = Aggregator(config(tmp_path, webhooks=[hook]))
    agg.start()
    try:
        agents.connect(agg.ingest_port)
        send_steps(agents, range(1, 31))  # rank 2 diverges: an alert goes to the webhook
        wait_until(lambda: _Hang.hits >= 1)  # the sink is now stuck in that request
        started = time.monotonic()
        send_steps(agents, range(31, 231))
        wait_until(lambda: agg.counters()["records_accepted"] == 230 * WORLD)
        elapsed = time.monotonic() - started
        assert elapsed < 3.0, f"800 records took {elapsed:.2f}s behind a hung webhook"
        assert agg.snapshot()["runs"][0]["last_step"] == 230
    finally:
        _Hang.release.set()
        agg.stop()
        httpd.shutdown()
        httpd.server_close()


AGENT_SCRIPT = textwrap.dedent(
    """
    import sys
    from rankwatch.agent.monitor import Monitor

    rank, port, log_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    mon = Monitor(run="agents", rank=rank, world_size=2, addr=f"127.0.0.1:{port}",
                  log_dir=log_dir, heartbeat_s=0.2)
    for step in range(1, 51):
        mon.log(step, loss=1.0 / step + 0.001 * rank)
    mon.close()
    """
)


def test_real_agent_processes_arrive_and_finish(agg: Aggregator, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(AGENT_SCRIPT)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(agg.ingest_port), str(tmp_path / "logs")]
        )
        for rank in range(2)
    ]
    for proc in procs:
        assert proc.wait(60) == 0

    def finished() -> bool:
        runs = agg.snapshot()["runs"]
        return bool(runs) and runs[0]["state"] == "finished"

    wait_until(finished)
    (run,) = agg.snapshot()["runs"]
    assert [r["last_step"] for r in run["ranks"]] == [50, 50]
    assert all(r["gaps"] == [] for r in run["ranks"])
    wait_until(lambda: agg.store.runs() and agg.store.runs()[0]["records"] >= 2 * 52)
    series = agg.store.series("agents", "loss")
    assert sorted(series) == [0, 1] and len(series[1]["step"]) == 50


def test_events_and_heartbeats_reach_health_in_order(agg: Aggregator) -> None:
    t = time.time()
    crash = EventRecord(
        run="r9", rank=0, seq=3, time=t, world_size=1, host="h", pid=1, event="crash", step=2,
        info={"exc_type": "RuntimeError", "message": "boom", "value": float("nan")},
    )  # fmt: skip
    beat = Heartbeat(run="r9", rank=0, seq=4, time=t, last_step=2, next_in=5.0, dropped=7)
    sub = agg.feed.subscribe()
    agg.add([step(0, 1, 1.0, run="r9", world=1), step(0, 2, 1.0, run="r9", world=1), crash])
    agg.add([beat])
    rank = agg.snapshot()["runs"][0]["ranks"][0]
    assert rank["state"] == "crashed" and "boom" in rank["message"]
    assert rank["dropped"] == 7 and rank["last_step"] == 2
    agg.tick()
    events = [m for m in sub.drain() if m["type"] == "event"]
    assert events and events[0]["event"] == "crash" and events[0]["info"]["value"] == "NaN"


def test_an_old_imported_history_is_stored_but_not_made_live(agg: Aggregator) -> None:
    old = [dataclasses.replace(step(0, s, 1.0, run="old", world=1), time=time.time() - 3600)
           for s in range(1, 6)]  # fmt: skip
    recent = [step(0, s, 1.0, run="recent", world=1) for s in range(1, 6)]
    assert agg.add(old) == 5 and agg.add(recent) == 5
    assert [r["run"] for r in agg.snapshot()["runs"]] == ["recent"]  # no "lost" alert later
    wait_until(lambda: {r["run"] for r in agg.store.runs()} == {"old", "recent"})
    assert agg.counters()["records_imported"] == 10


def test_runs_over_for_long_leave_the_live_state_but_stay_deduped(agg: Aggregator) -> None:
    end = EventRecord(
        run="done", rank=0, seq=2, time=time.time(), world_size=1, host="h", pid=100,
        event="end", step=1, info={"reason": "normal"},
    )  # fmt: skip
    agg.add([step(0, 1, 1.0, run="done", world=1), end, step(0, 1, 1.0, run="live", world=1)])
    agg.tick(time.time() + 60)
    assert {r["run"] for r in agg.snapshot()["runs"]} == {"done", "live"}
    later = time.time() + LIVE_RETENTION_S + 60
    agg.add([step(0, 2, 1.0, run="live", world=1)], imported=False, now=later - 1)
    agg.tick(later)
    assert {r["run"] for r in agg.snapshot(later)["runs"]} == {"live"}
    assert agg.add([step(0, 1, 1.0, run="done", world=1)]) == 0


def test_runs_over_are_looked_for_once_a_while_not_on_every_tick(tmp_path: Path) -> None:
    """The look is a pass over a run's ranks until one is alive: with thousands lost it was
    most of every tick."""
    from rankwatch.aggregator.health import HealthTracker
    from rankwatch.aggregator.tick import RETIRE_EVERY_S, retire_runs

    class Ranks(dict):  # type: ignore[type-arg]
        looked = 0

        def values(self):  # type: ignore[no-untyped-def]
            Ranks.looked += 1
            return super().values()

    tracker = HealthTracker()
    tracker.observe(step(0, 1, 1.0, run="big", world=1), 1000.0)
    ranks = Ranks(tracker.snapshot(1001.0)["big"])  # alive: one pass over it each look
    agg = Aggregator(config(tmp_path))
    try:
        for t in (1060.0, 1060.2, 1061.0, 1060.0 + RETIRE_EVERY_S - 1):
            retire_runs(agg, {"big": ranks}, t)
        assert Ranks.looked == 1
        retire_runs(agg, {"big": ranks}, 1060.0 + RETIRE_EVERY_S)
        assert Ranks.looked == 2
    finally:
        agg.store.close()


def test_tick_sees_a_crash_at_once_and_a_silent_rank_lost_within_a_second(
    tmp_path: Path,
) -> None:
    """Rank health is re-evaluated at once after a record that may change a state, and at
    least every HEALTH_EVERY_S otherwise (only the passing of time moves states then)."""
    agg = Aggregator(config(tmp_path))  # not started: the test drives the ticks and the clock
    try:
        t = 1000.0

        def fired(alerts: list[Alert], rule: str) -> list[int | None]:
            return [a.rank for a in alerts if a.rule == rule and a.state == "firing"]

        agg.add([step(r, 1, 1.0, run="h", world=2) for r in (0, 1)], imported=False, now=t)
        assert fired(agg.tick(t), "crashed") == []
        crash = EventRecord(
            run="h", rank=1, seq=2, time=t, world_size=2, host="h", pid=101, event="crash",
            step=1, info={"exc_type": "E"},
        )  # fmt: skip
        agg.add([crash], imported=False, now=t + 0.2)
        assert fired(agg.tick(t + 0.2), "crashed") == [1]  # 0.2 s after the last evaluation
        lost_at = None
        for i in range(2, 80):  # a tick every 0.2 s; rank 0 is silent from t on
            now = t + 0.2 * i
            if fired(agg.tick(now), "lost") == [0]:
                lost_at = now
                break
        assert lost_at is not None
        assert t + agg.config.lost_after_s < lost_at <= t + agg.config.lost_after_s + 1.2
    finally:
        agg.stop()


def test_a_real_rank_is_stored_soon_after_two_thousand_one_record_runs(
    agg: Aggregator, tmp_path: Path
) -> None:
    """2,000 distinct runs in one body (an HTTP ingest POST's path), then a real agent: its
    record reaches the store within the flushes right after (the band of 2,000 runs no longer
    costs a fold each), and stopping stays prompt."""
    from rankwatch.agent.monitor import Monitor

    now = time.time()
    flood = [StepRecord(f"f{i}", 0, 1, now, 1, "h", 1, 0, None, {"loss": 1.0}) for i in range(2000)]
    assert agg.add(flood, imported=False) == 2000
    mon = Monitor(run="real", rank=0, world_size=1, addr=f"127.0.0.1:{agg.ingest_port}",
                  log_dir=tmp_path / "logs", heartbeat_s=60.0)  # fmt: skip
    try:
        mon.log(1, loss=0.5)
        wait_until(lambda: any(r["run"] == "real" for r in agg.store.runs()), timeout_s=20.0,
                   what="the real rank's record stored")  # fmt: skip
    finally:
        mon.close()
    assert len(agg.store.runs()) == 2001
    assert agg.counters()["store_set_aside_records"] == 0
