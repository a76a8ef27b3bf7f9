"""Telemetry through the wired aggregator: real ZeroMQ on 127.0.0.1, the real store, alerts,
incident evidence and the live stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import Record, StepRecord, TelemetryRecord
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.store.db import Store

from tests.polling import wait_until

WORLD = 8


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def card(rank: int, seq: int, t: float) -> TelemetryRecord:
    hot = rank == 5
    values = {
        "gpu/temp_c": 94.0 if hot else 64.0 + rank % 3,
        "gpu/sm_clock_mhz": 1400.0 if hot else 1980.0,
        "gpu/util_pct": 97.0,
        "gpu/mem_used_bytes": 60e9,
        "gpu/mem_total_bytes": 80e9,
        "gpu/power_w": 640.0,
        "gpu/throttle_mask": float(0x40 if hot else 0),
        "gpu/ecc_uncorrected_total": 0.0,
    }
    labels = {"gpu/throttle": "sw_thermal"} if hot else {}
    return TelemetryRecord("r", rank, seq, t, f"node{rank // 4}", 100 + rank, "gpu",
                           f"gpu:{rank % 4}", values, labels)  # fmt: skip


def step(rank: int, seq: int, s: int) -> StepRecord:
    slow = rank == 5 and s >= 10
    metrics = {"loss": 2.0 / (1 + 0.05 * s), "step_time": 1.6 if slow else 1.0 + 0.01 * rank}
    return StepRecord("r", rank, seq, time.time(), WORLD, f"node{rank // 4}", 100 + rank, s, 0,
                      metrics)  # fmt: skip


def test_a_hot_throttled_card_alerts_and_its_slow_rank_incident_says_why(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    cfg = ServeConfig(data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
                      flush_interval_s=0.05, console_alerts=False)  # fmt: skip
    with Aggregator(cfg) as agg:
        socks = []
        for _ in range(WORLD):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{agg.ingest_port}")
            socks.append(sock)
        seqs = [0] * WORLD

        def send(rank: int, recs: list[Record]) -> None:
            socks[rank].send(records.encode_frame(recs))

        sub = agg.feed.subscribe()
        t0 = time.time() - 80.0
        for i in range(8):  # 80 s of samples at 10 s, each rank at its own phase
            for rank in range(WORLD):
                seqs[rank] += 1
                send(rank, [card(rank, seqs[rank], t0 + 10 * i + 0.3 * rank)])
        firing = wait_until(
            lambda: {(a.rule, a.rank) for a in agg.alerts.firing()} >= {("hw_hot", 5)},
            what="hw_hot on rank 5", detail=lambda: agg.alerts.firing(),
        )  # fmt: skip
        rules = {(a.rule, a.rank) for a in agg.alerts.firing()}
        assert rules == {("hw_hot", 5), ("hw_clock", 5), ("hw_throttle", 5)}, firing
        for s in range(40):
            for rank in range(WORLD):
                seqs[rank] += 1
                send(rank, [step(rank, seqs[rank], s)])
        incident = wait_until(
            lambda: next((i for i in agg.incidents_of("r") if 5 in i["culprits"]
                          and "card 5" in i["summary"]), None),
            what="an incident on rank 5 with its card's note", detail=lambda: agg.incidents_of("r"),
        )  # fmt: skip
        assert "card 5 (gpu:1 on node1) at 94 °C (peers 65 °C)" in incident["summary"]
        clock = "SM clock 71% of its peers', at similar power (100% of its peers')"
        assert clock in incident["summary"]
        assert "sw thermal slowdown" in incident["summary"]
        assert incident["timeline"][-1]["what"].startswith("card 5 (gpu:1 on node1) at 94 °C")
        messages = []
        wait_until(
            lambda: (
                messages.extend(sub.drain())
                or any(  # type: ignore[func-returns-value]
                    m.get("type") == "telemetry" for m in messages
                )
            ),
            what="a telemetry message",
        )
        tele = next(m for m in messages if m.get("type") == "telemetry")
        row = tele["ranks"]["5"]
        assert (row["temp"], row["util"], row["host"], row["device"]) == (94.0, 97.0, "node1",
                                                                        "gpu:1")  # fmt: skip
        assert row["flags"] == ["gpu/sm_clock_mhz", "gpu/temp_c", "throttle"]
        for sock in socks:
            sock.close(0)
    with Store(tmp_path / "data") as store:
        assert store.telemetry_series("r", "gpu/temp_c", ranks=[5])[5]["value"] == [94.0] * 8
        stored = store.incidents("r")
        assert any("at 94 °C" in i["summary"] for i in stored)
