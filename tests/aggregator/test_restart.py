"""A rank that restarts without its old JSONL: real Monitors, a real aggregator and store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import msgpack
import pytest
import zmq
from rankwatch.agent.fallback import read_records
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import EventRecord, StepRecord
from rankwatch.aggregator.ingest.importer import import_into_store, import_paths
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.store.db import Store

from tests.polling import wait_until

STEPS = 100


def config(tmp_path: Path, **kw: Any) -> ServeConfig:
    kw.setdefault("flush_interval_s", 0.05)
    kw.setdefault("console_alerts", False)
    kw.setdefault("data_dir", tmp_path / "data")
    return ServeConfig(ingest_host="127.0.0.1", ingest_port=0, **kw)


@pytest.fixture
def agg(tmp_path: Path) -> Iterator[Aggregator]:
    aggregator = Aggregator(config(tmp_path))
    aggregator.start()
    yield aggregator
    aggregator.stop()


def train(log_dir: Path, port: int | None, first_step: int = 1) -> Monitor:
    addr = None if port is None else f"127.0.0.1:{port}"
    mon = Monitor(run="reuse", rank=0, world_size=1, addr=addr, log_dir=log_dir, heartbeat_s=0.2)
    for step in range(first_step, first_step + STEPS):
        mon.log(step, loss=1.0 / step)
    mon.close()
    return mon


def stored_steps(store: Store) -> list[tuple[int, float]]:
    series = store.series("reuse", "loss", max_points=10 * STEPS).get(0)
    return sorted(zip(series["step"], series["value"], strict=True)) if series else []


def test_a_restart_in_another_log_dir_loses_nothing(agg: Aggregator, tmp_path: Path) -> None:
    feed = agg.feed.subscribe()
    first = train(tmp_path / "A", agg.ingest_port)
    wait_until(lambda: agg.counters()["records_accepted"] >= STEPS + 2)
    second = train(tmp_path / "B", agg.ingest_port, first_step=STEPS + 1)
    assert first.incarnation != second.incarnation
    wait_until(lambda: agg.counters()["records_received"] >= 2 * (STEPS + 2))
    agg.flush_store()
    steps = stored_steps(agg.store)
    assert [s for s, _ in steps] == list(range(1, 2 * STEPS + 1))  # 200 logged, 200 stored
    assert agg.counters()["records_duplicates"] == 0
    assert agg.counters()["rank_restarts"] == 1

    # the restart is an event: in the store and on the live feed, naming both incarnations
    restart = [e for e in agg.store.events("reuse") if e["event"] == "restart"]
    assert len(restart) == 1
    info = restart[0]["info"]
    assert info == {
        "previous_inc": first.incarnation, "previous_step": STEPS,
        "inc": second.incarnation, "step": STEPS + 1,
    }  # fmt: skip
    assert restart[0]["step"] == STEPS + 1 and restart[0]["rank"] == 0
    published: list[dict[str, Any]] = []

    def restart_published() -> bool:
        published.extend(m for m in feed.drain() if m.get("type") == "event")
        return any(m["event"] == "restart" for m in published)

    wait_until(restart_published)
    assert [m["info"] for m in published if m["event"] == "restart"] == [info]

    # importing both files afterwards adds nothing; the resend path had nothing to ask for
    agg.store.flush()
    before = agg.counters()["records_accepted"]
    summaries = import_paths([tmp_path / "A", tmp_path / "B"], agg)
    assert sum(s.accepted for s in summaries) == 0
    assert agg.counters()["records_accepted"] == before
    assert [r["gaps"] for r in agg.snapshot()["runs"][0]["ranks"]] == [[]]


def test_both_incarnations_import_completely_and_once(tmp_path: Path) -> None:
    train(tmp_path / "A", None)
    train(tmp_path / "B", None, first_step=STEPS + 1)
    data = tmp_path / "data"
    records_each = STEPS + 2  # steps plus start and end events
    summaries = import_into_store([tmp_path / "A", tmp_path / "B"], data)
    assert [s.accepted for s in summaries] == [records_each, records_each]
    with Store(data) as store:
        assert [s for s, _ in stored_steps(store)] == list(range(1, 2 * STEPS + 1))
        # record for record, with their incarnations, identities included
        stored = {(r.inc, r.seq): records.to_json_line(r) for r in store.records("reuse")}
    written = {
        (r.inc, r.seq): records.to_json_line(r)
        for d in "AB"
        for r in read_records(tmp_path / d / "reuse" / "rank0.jsonl")
    }
    assert len(written) == 2 * records_each and stored == written
    again = import_into_store([tmp_path / "B", tmp_path / "A"], data)
    assert [s.accepted for s in again] == [0, 0]


def test_an_import_into_a_live_aggregator_records_the_restart_once(tmp_path: Path) -> None:
    train(tmp_path / "A", None)
    train(tmp_path / "B", None, first_step=STEPS + 1)
    records = STEPS + 2
    with Aggregator(config(tmp_path)) as agg:
        # the later process first: the earlier one's history is no restart
        assert [s.accepted for s in import_paths([tmp_path / "B"], agg)] == [records]
        assert [s.accepted for s in import_paths([tmp_path / "A"], agg)] == [records]
        agg.flush_store()
        assert [e["event"] for e in agg.store.events("reuse")].count("restart") == 0
        assert len(stored_steps(agg.store)) == 2 * STEPS
    with Aggregator(config(tmp_path, data_dir=tmp_path / "other")) as agg:
        assert [s.accepted for s in import_paths([tmp_path / "A", tmp_path / "B"], agg)] == [
            records, records,
        ]  # fmt: skip
        agg.flush_store()
        (restart,) = [e for e in agg.store.events("reuse") if e["event"] == "restart"]
        assert restart["info"]["previous_step"] == STEPS and restart["step"] == STEPS + 1
    with Aggregator(config(tmp_path, data_dir=tmp_path / "other")) as agg:  # from the store
        assert [s.accepted for s in import_paths([tmp_path / "B", tmp_path / "A"], agg)] == [0, 0]
        assert agg.restarts.restarts == 0


def rec(seq: int, inc: int, step: int | None = None, t: float | None = None) -> StepRecord:
    step = seq if step is None else step
    t = time.time() + step * 1e-3 if t is None else t
    return StepRecord("reuse", 0, seq, t, 1, "h", 10 + inc, step, None, {"loss": 1.0}, inc)


def test_a_restart_seen_after_the_aggregator_restarted_names_the_stored_incarnation(
    tmp_path: Path,
) -> None:
    with Aggregator(config(tmp_path)) as agg:
        assert agg.add([rec(s, inc=5) for s in range(1, 11)], imported=False) == 10
    with Aggregator(config(tmp_path)) as agg:  # dedupe state from the store, per incarnation
        assert agg.add([rec(s, inc=5) for s in range(1, 11)], imported=False) == 0
        assert agg.restarts.restarts == 0  # duplicates, and the known incarnation: no restart
        assert agg.add([rec(s, inc=9, step=10 + s) for s in range(1, 11)], imported=False) == 10
        agg.flush_store()
        (restart,) = [e for e in agg.store.events("reuse") if e["event"] == "restart"]
        assert restart["info"] == {"previous_inc": 5, "previous_step": None, "inc": 9, "step": 11}
        assert restart["pid"] == 19 and restart["seq"] == 0
        assert agg.counters()["records_accepted"] == 10  # the event is no record received


def test_resends_are_asked_of_the_newest_incarnation(tmp_path: Path) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        with Aggregator(config(tmp_path)) as agg:
            sock.connect(f"tcp://127.0.0.1:{agg.ingest_port}")
            sock.send(records.encode_frame([rec(s, inc=5) for s in (1, 3)]))  # a gap at 2 ...
            newer = [rec(s, inc=9, step=10 + s) for s in (1, 2, 5)]
            sock.send(records.encode_frame(newer))  # ... and at 3..4 of the newer one
            assert sock.poll(5000), "no resend request arrived"
            request = msgpack.unpackb(sock.recv())
            assert request == {"v": 1, "resend_from": 3, "run": "reuse", "rank": 0, "inc": 9}
            sock.send(records.encode_frame([rec(s, inc=9, step=10 + s) for s in (3, 4)]))
            wait_until(lambda: agg.counters()["records_accepted"] == 7)
            assert agg.snapshot()["runs"][0]["ranks"][0]["gaps"] == []  # the newest's gaps
    finally:
        sock.close(0)
        ctx.term()


def test_a_store_made_before_incarnations_opens_with_its_seqs_as_incarnation_0(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.duckdb"
    with Store(path) as store:
        store.append([rec(s, inc=0) for s in range(1, 4)])
        store.flush()
    con = duckdb.connect(str(path))
    for table in ("seqs", "ranks"):  # the layout older versions wrote
        con.execute(f"ALTER TABLE {table} DROP COLUMN inc")
    con.close()
    with Store(path) as store:
        assert store.seen_seqs() == [("reuse", 0, 0, 1, 3)]
        assert store.ranks("reuse")[0]["inc"] == 0
        store.append([rec(1, inc=7)])
        store.flush()
        assert store.seen_seqs() == [("reuse", 0, 0, 1, 3), ("reuse", 0, 7, 1, 1)]


def test_the_stores_rank_row_follows_the_newest_incarnation(tmp_path: Path) -> None:
    def life(seq: int, inc: int, kind: str, t: float) -> EventRecord:
        return EventRecord("reuse", 0, seq, t, 1, "h", 10 + inc, kind, None, {}, inc)

    t = time.time()
    first = [life(1, 5, "start", t), *(rec(s, 5, t=t + s) for s in range(2, 50))]
    first.append(life(50, 5, "end", t + 50))
    second = [
        life(1, 9, "start", t + 100),
        *(rec(s, 9, step=48 + s, t=t + 100 + s) for s in (2, 3)),
    ]
    with Store(tmp_path / "s.duckdb") as store:
        store.append(first)
        store.flush()
        assert store.ranks("reuse")[0]["ended"]
        store.append(second)
        store.flush()
        # before: the end of the earlier process (seq 50) outranked the new one's start (seq 1)
        (row,) = store.ranks("reuse")
        assert (row["pid"], row["ended"], row["last_step"]) == (19, False, 51)
        store.append([rec(s, 5, t=t + 50 + s / 100) for s in (60, 61)])  # the earlier one, late
        store.flush()
        (row,) = store.ranks("reuse")
        assert (row["pid"], row["inc"], row["records"]) == (19, 9, 55)
