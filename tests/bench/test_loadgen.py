"""The load generator, and a CI-sized load test against a real ``rankwatch serve``."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from loadgen import LOSS_SIGMA, Fault, LoadConfig, LoadGen, Model, parse_faults
from loadgen_worker import pack
from rankwatch.agent.wire import records
from serve_proc import ServeProc

# --- the pure parts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("drift:17:3", [Fault("drift", 17, 3.0, 10)]),
        ("drift:17", [Fault("drift", 17, 3.0, 10)]),
        ("nan:5@40", [Fault("nan", 5, None, 40)]),
        ("spike:9, slow:3:1.5@2", [Fault("spike", 9, 20.0, 10), Fault("slow", 3, 1.5, 2)]),
        ("hang:7,lost:8@30,", [Fault("hang", 7, None, 10), Fault("lost", 8, None, 30)]),
        ("hot:2,throttle:3@5", [Fault("hot", 2, 25.0, 10), Fault("throttle", 3, 0.7, 5)]),
        ("ecc:4:9,nodeslow:9:2", [Fault("ecc", 4, 9.0, 10), Fault("nodeslow", 9, 2.0, 10)]),
        ("", []),
    ],
)
def test_parse_faults(text: str, expected: list[Fault]) -> None:
    assert parse_faults(text, world=64, default_step=10) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("melt:3", "kind must be one of"),
        ("drift", "expected kind:rank"),
        ("drift:x", "must be integers"),
        ("drift:64", "not in 0..63"),
        ("nan:1@0", "onset step must be >= 1"),
        ("slow:1:0", "slow factor must be > 0"),
        ("throttle:1:0", "throttle factor must be > 0"),
        ("drift:1:nan", "magnitude must be finite"),
    ],
)
def test_parse_faults_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_faults(text, world=64, default_step=10)


def test_model_is_seeded_and_faults_act_from_their_onset() -> None:
    faults = [Fault("drift", 3, 4.0, 5), Fault("nan", 4, None, 5), Fault("spike", 6, 20.0, 5)]
    clean, faulty = Model(16, 5.0, 7, []), Model(16, 5.0, 7, faults)
    for step in (4, 5, 6):
        a, b = clean.values(step), faulty.values(step)
        again = Model(16, 5.0, 7, []).values(step)
        np.testing.assert_array_equal(a["grad_norm"], again["grad_norm"])
        assert len(set(a["lr"].tolist())) == 1  # one schedule, bit-identical on every rank
        level = 0.5 + 2.0 * math.exp(-step / 500)
        drift = b["loss"][3] - a["loss"][3]
        assert drift == pytest.approx(4.0 * LOSS_SIGMA * level if step >= 5 else 0.0)
        assert math.isnan(b["loss"][4]) == (step >= 5)
        assert (b["loss"][6] > a["loss"][6]) == (step == 5)  # a spike lasts one step
        np.testing.assert_array_equal(a["loss"][7:], b["loss"][7:])


def test_hardware_faults_show_in_the_telemetry_from_their_onset() -> None:
    faults = [
        Fault("hot", 2, 25.0, 5), Fault("throttle", 3, 0.7, 5), Fault("ecc", 4, 2.0, 5),
        Fault("nodeslow", 9, 1.5, 5),
    ]  # fmt: skip
    clean, faulty = Model(24, 5.0, 7, [], 8), Model(24, 5.0, 7, faults, 8)
    for step in (4, 5, 7):
        a, b = clean.telemetry(step), faulty.telemetry(step)
        np.testing.assert_array_equal(
            a["gpu/temp_c"], Model(24, 5.0, 7, [], 8).telemetry(step)["gpu/temp_c"]
        )
        on = step >= 5
        assert b["gpu/temp_c"][2] - a["gpu/temp_c"][2] == pytest.approx(25.0 if on else 0.0)
        assert b["gpu/sm_clock_mhz"][3] == pytest.approx(
            a["gpu/sm_clock_mhz"][3] * (0.7 if on else 1)
        )
        assert b["gpu/throttle_mask"][3] == (0x60 if on else 0)
        assert b["gpu/ecc_uncorrected_total"][4] == (2.0 if on else 0.0)
        assert b["gpu/ecc_corrected_total"][4] == (200.0 * (step - 4) if on else 0.0)
        node = slice(8, 16)  # rank 9's node: ranks 8..15
        assert (b["host/cpu_pct"][node] == 100.0).all() == on
        ratio = faulty.values(step)["step_time"] / clean.values(step)["step_time"]
        np.testing.assert_allclose(ratio[node], 1.5 if on else 1.0)
        assert ratio[3] == pytest.approx(1 / 0.7 if on else 1.0)
        for key in ("gpu/temp_c", "gpu/sm_clock_mhz", "host/cpu_pct"):  # nobody else moved
            np.testing.assert_array_equal(a[key][16:], b[key][16:])


def test_segments_cover_every_rank_once_per_address() -> None:
    cfg = LoadConfig(ranks=10, procs=3, addrs=["tcp://a:1", "tcp://b:1"])
    segs = [s for worker in cfg.segments() for s in worker]
    assert sorted(r for lo, hi, _ in segs for r in range(lo, hi)) == list(range(10))
    assert {addr for lo, _, addr in segs if lo < 5} == {"tcp://a:1"}
    assert {addr for _, hi, addr in segs if hi > 5} == {"tcp://b:1"}


def test_pack_keeps_frames_under_the_limit() -> None:
    rec = {"kind": "step", "run": "r", "rank": 0, "seq": 1, "time": 1.0, "world_size": 1,
           "host": "h" * 200, "pid": 1, "step": 1, "epoch": 0,
           "metrics": {"loss": 1.0}}  # fmt: skip
    batch = [dict(rec, seq=i + 1) for i in range(20_000)]  # ~5 MB packed in one frame
    frames = pack(batch)
    assert len(frames) > 1
    assert all(len(f) <= records.MAX_FRAME_BYTES for f, _ in frames)
    got = [r["seq"] for f, _ in frames for r in msgpack.unpackb(f)["records"]]
    assert got == list(range(1, 20_001))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sockets", ["rank", "process"])
def test_telemetry_reaches_a_real_receiver_in_frames_of_its_own(sockets: str) -> None:
    from rankwatch.aggregator.ingest.receiver import Receiver

    receiver = Receiver("127.0.0.1", 0)
    config = LoadConfig(
        ranks=16, rate=4.0, duration=3.0, procs=1, sockets=sockets, run=f"tele-{sockets}",
        addrs=[f"tcp://127.0.0.1:{receiver.port}"], telemetry_s=0.5,
        faults=[Fault("hot", 5, 25.0, 2)],
    )  # fmt: skip
    gen = LoadGen(config)
    got: list[records.Record] = []
    try:
        gen.start()
        while any(w.proc.poll() is None for w in gen.workers):
            got.extend(records.unblock(receiver.recv(50)))
        summary = gen.wait(timeout_s=30)
        deadline = time.monotonic() + 10
        while len(got) < summary["records"] and time.monotonic() < deadline:
            got.extend(records.unblock(receiver.recv(50)))
    finally:
        gen.kill()
        receiver.close()
    tele = [r for r in got if isinstance(r, records.TelemetryRecord)]
    assert len(got) == summary["records"] and receiver.counters()["reasons"] == {}
    assert len(tele) == summary["by_kind"]["telemetry"] == 16 * 2 * 6  # 2 a sample, 6 samples
    hot = [r.values["gpu/temp_c"] for r in tele if r.source == "gpu" and r.rank == 5]
    others = [r.values["gpu/temp_c"] for r in tele if r.source == "gpu" and r.rank != 5]
    assert min(hot[1:]) > max(others) and {r.device for r in tele if r.rank == 9} == {"gpu:1", ""}


# --- CI-sized load test --------------------------------------------------------------------

RANKS, RATE, DURATION, BAD = 64, 4.0, 5.0, 17


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sockets", ["rank", "node", "process"])
def test_load_against_real_aggregator(sockets: str) -> None:
    run = f"ci-load-{sockets}"
    config = LoadConfig(
        ranks=RANKS, rate=RATE, duration=DURATION, procs=2, sockets=sockets, run=run,
        faults=[Fault("drift", BAD, 5.0, 5)],
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, ServeProc(Path(tmp) / "data") as head:
        config.addrs = [head.addr]
        gen = LoadGen(config)
        gen.start()
        backlog = []
        try:
            while any(w.proc.poll() is None for w in gen.workers):
                time.sleep(1.0)
                sent = gen.sent()
                backlog.append(sent - head.counters().get("records_accepted", 0))
            summary = gen.wait(timeout_s=30)
        finally:
            gen.kill()
        sent = summary["records"]
        deadline = time.monotonic() + 10
        while head.stored(run) < sent and time.monotonic() < deadline:
            time.sleep(0.2)
        counters = head.counters()
        stored = head.stored(run)
        divergence = head.get(f"/api/runs/{run}/divergence")
    steps = round(RATE * DURATION)
    assert summary["by_kind"]["step"] == RANKS * steps
    assert summary["by_kind"]["event"] == 2 * RANKS  # start and end
    # No backlog: at every sample the aggregator had taken all but about one step of records.
    assert max(backlog) <= 2 * RANKS, backlog
    assert counters["records_accepted"] == sent
    assert counters["ingest_bad_messages"] == counters["ingest_bad_records"] == 0
    assert stored == sent
    assert counters["merge_late"] == counters["merge_evicted"] == 0  # every step scored
    flagged = {(d["rank"], d["metric"]) for d in divergence["divergences"]}
    assert flagged == {(BAD, "loss")}
    # one connection per rank, per node of 8 (each named by its first rank), per load process
    connections = {"rank": RANKS, "node": RANKS // 8, "process": 2}[sockets]
    assert counters["ingest_connections"] == connections, counters["senders"]


@pytest.mark.timeout(60)
def test_soak_baseline_receives_and_times_every_record() -> None:
    """scale_soak's bare receive loop takes the whole load and gives its CPU per record."""
    from scale_soak import bare_phase

    config = LoadConfig(ranks=16, rate=5.0, duration=1.0, procs=1, sockets="process", run="b")
    bare = bare_phase(config, 1.0)
    assert bare["records"] == bare["sent"] >= 16 * 5
    assert 0 < bare["us"] < 1000
