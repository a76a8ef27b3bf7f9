"""Bad input: no frame can crash decoding or the store, and a real `rankwatch serve` fuzzed on
its ingest port (about 20,000 messages, hypothesis-driven) stays up, counts every rejection by
reason exactly as the wire schema predicts, and stores every valid record, the valid ranks'
(real Monitor processes publishing meanwhile) and the fuzzer's alike. The million-frame run is
``bench/fuzz_ingest.py``."""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rankwatch.agent.wire import records
from rankwatch.aggregator.store.db import Store

from .conftest import Spawner
from .frames import FUZZ_RUNS, Expected, Sequencer, mutate, pack, random_message
from .procs import compare, read_jsonl, read_store, wait_until

VALID_RUN = "fuzz-valid"
OVERSIZED = 3  # connections that each send one frame over records.MAX_FRAME_BYTES

# Any msgpack value: what a confused or hostile peer may put anywhere.
ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
scalars = st.one_of(
    st.none(), st.booleans(), ints, st.floats(),
    st.text(max_size=40), st.binary(max_size=8),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12,
)
not_str = values.filter(lambda v: not isinstance(v, str))  # bounded run names, bounded runs
names = st.sampled_from(FUZZ_RUNS) | st.just("") | st.text(min_size=257, max_size=300) | not_str
metric_maps = st.dictionaries(
    st.text(max_size=20) | st.text(min_size=257, max_size=260),
    st.floats() | st.sampled_from(["NaN", "Infinity", "-Infinity", "nan"]) | values, max_size=4,
) | values  # fmt: skip
common = {
    "run": names,
    "rank": st.integers(0, 7) | st.integers(records.MAX_RANK + 1, 2**64 - 1) | not_str,
    "seq": st.integers(-3, 10**6) | values,
    "time": st.floats() | values,
}
record_maps = st.one_of(
    st.fixed_dictionaries({"kind": st.just("step"), **common}, optional={
        "world_size": st.integers(-1, 9) | values, "host": st.text(max_size=9) | values,
        "pid": st.integers(-1, 2**40) | values, "epoch": st.none() | ints | values,
        "step": st.integers(-(2**63), 2**63 - 1) | values, "metrics": metric_maps}),
    st.fixed_dictionaries({"kind": st.just("event"), **common}, optional={
        "world_size": st.integers(1, 9), "host": st.text(max_size=9), "pid": st.integers(0, 9),
        "event": st.sampled_from(records.EVENT_KINDS) | values, "step": st.none() | values,
        "info": st.dictionaries(st.text(max_size=5), values, max_size=4) | values}),
    st.fixed_dictionaries({"kind": st.just("heartbeat") | values, **common}, optional={
        "last_step": st.none() | ints | values, "next_in": st.floats() | values,
        "dropped": st.integers(-1, 10) | values,
        "paused": st.none() | st.text(max_size=5) | values}),
)  # fmt: skip
envelopes = st.fixed_dictionaries(
    {"records": st.lists(record_maps, max_size=3) | values},
    optional={"v": st.just(records.SCHEMA_VERSION) | st.integers(-2, 5) | values},
)


@settings(max_examples=1000, deadline=None, database=None)
@given(
    frame=st.binary(max_size=200)
    | envelopes.map(pack)
    | st.tuples(envelopes.map(pack), st.randoms(use_true_random=False)).map(
        lambda fr: mutate(fr[1], fr[0])
    )
)
def test_decode_only_ever_raises_decode_error(frame: bytes) -> None:
    # the receiver's decoder (batched frames as blocks) accepts and refuses exactly the same
    try:
        blocks = records.decode_frame_blocks(frame)
    except records.DecodeError as exc:
        blocks = exc
    try:
        decoded = records.decode_frame(frame)
    except records.DecodeError as exc:
        assert exc.reason in ("msgpack", "envelope", "version", "field", "size", "records")
        assert len(str(exc)) < 1000  # messages quote values, boundedly
        assert isinstance(blocks, records.DecodeError) and str(blocks) == str(exc)
        return
    assert not isinstance(blocks, records.DecodeError)
    flat = records.unblock(blocks)
    # through JSON, where NaN is "NaN" (NaN != NaN); metric order is not part of a record
    assert [json.loads(records.to_json_line(r)) for r in flat] == [
        json.loads(records.to_json_line(r)) for r in decoded
    ]
    for rec in decoded:  # what is accepted must survive the JSONL round trip
        assert records.from_json_line(records.to_json_line(rec)).seq == rec.seq


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_whatever_decode_accepts_the_store_can_store(tmp_path: Path) -> None:
    """A record the schema accepts but the store cannot write would block every later flush."""
    rng, seqs, accepted = random.Random(7), Sequencer(), []
    for _ in range(20_000):
        message = random_message(rng, seqs)
        if len(message) != 1:
            continue
        try:
            accepted.extend(records.decode_frame(message[0]))
        except records.DecodeError:
            continue
    extremes = [
        records.StepRecord("x", records.MAX_RANK, 2**63 - 1, math.nan, 2**63 - 1, "\x00", 2**63 - 1,
                           -(2**63), 2**63 - 1, {"\x00": -math.inf}),
        records.EventRecord("y", 0, 1, math.inf, 1, "", 0, "note", None,
                            {"d": _nested(records.MAX_INFO_DEPTH - 1)}),
    ]  # fmt: skip
    with Store(tmp_path / "data") as store:
        store.append([*accepted, *extremes])
        store.flush()
        stored = sum(r["records"] for r in store.runs())
    # every one stored (the store keeps duplicates; the aggregator drops them first), none set
    # aside: a seq or step at the int64 edge once overflowed the seq-interval merge
    assert stored == len(accepted) + len(extremes)
    assert not list((tmp_path / "data").glob("set_aside/*"))


def _prom_errors(serve: Any) -> Counter[str]:
    family = serve.metrics().get("rankwatch_aggregator_ingest_errors", {})
    return Counter({dict(labels)["kind"]: int(v) for labels, v in family.items()})


@pytest.mark.timeout(180)
def test_a_fuzzed_serve_stays_up_counts_every_rejection_and_stores_every_valid_record(
    spawn: Spawner, tmp_path: Path, report: Any
) -> None:
    serve = spawn.serve()
    stop, logs = tmp_path / "stop", tmp_path / "logs"
    ranks = [spawn.rank(VALID_RUN, k, 2, serve.addr, logs, interval=0.01, stop_file=stop)
             for k in range(2)]  # fmt: skip
    wait_until("the valid ranks", lambda: len(serve.rank_states(VALID_RUN)) == 2, 60)
    ctx = zmq.Context()
    fuzzer = ctx.socket(zmq.DEALER)
    fuzzer.setsockopt(zmq.LINGER, 0)
    fuzzer.setsockopt(zmq.SNDHWM, 0)  # never drop: every message must be counted
    fuzzer.connect(f"tcp://{serve.addr}")
    expected, seqs = Expected(), Sequencer()
    started = time.monotonic()

    @settings(
        max_examples=200, deadline=None, database=None,
        suppress_health_check=[
            HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
        ],
    )  # fmt: skip
    @given(seed=st.integers(0, 2**32 - 1), extra=st.lists(envelopes, max_size=5))
    def send_batch(seed: int, extra: list[dict[str, Any]]) -> None:
        # Hypothesis picks the seed and the structured envelopes; the seed drives the cheap
        # random mutations (frames.py) that make up the volume.
        rng = random.Random(seed)
        batch = [random_message(rng, seqs) for _ in range(95)] + [[pack(e)] for e in extra]
        for message in batch:
            expected.add(message)
            fuzzer.send_multipart(message)
        serve.check_alive()

    try:
        send_batch()
        big = pack({"v": 1, "records": ["x" * records.MAX_FRAME_BYTES]})
        for _ in range(OVERSIZED):  # each on a connection of its own, which libzmq then drops
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(f"tcp://{serve.addr}")
            sock.send(big)
            sock.close()
        # An agent newer than the aggregator (its own connection: problems are logged once per
        # sender and reason) must be told about in words, not only counted.
        newer = ctx.socket(zmq.DEALER)
        newer.setsockopt(zmq.LINGER, 2000)
        newer.connect(f"tcp://{serve.addr}")
        message = [pack({"v": records.SCHEMA_VERSION + 1, "records": []})]
        expected.add(message)
        newer.send_multipart(message)
        newer.close()
        last = [pack({"v": 1, "records": []}), b"end"]  # in order after everything else
        expected.add(last)
        fuzzer.send_multipart(last)
        sent_s = time.monotonic() - started
        wait_until(
            "every rejection to be counted",
            lambda: _prom_errors(serve) == expected.reasons,
            60, 0.5, lambda: f"counted {_prom_errors(serve)}\nexpected {expected.reasons}",
        )  # fmt: skip
        wait_until(
            "the oversized frames to cost their connections",
            lambda: serve.counter("ingest_disconnects") >= OVERSIZED, 30,
        )  # fmt: skip
    finally:
        fuzzer.close()
        ctx.term()
    assert serve.counter("ingest_bad_messages") == expected.bad_messages
    assert serve.counter("ingest_bad_records") == expected.bad_records
    assert serve.counter("internal_errors") == 0
    assert serve.counter("store_errors") == 0
    assert "upgrade rankwatch on the head node" in serve.output()
    stop.touch()
    assert [r.wait(30) for r in ranks] == [0, 0]
    finished = {0: "finished", 1: "finished"}
    wait_until("the valid ranks to finish",
               lambda: serve.rank_states(VALID_RUN) == finished, 30)  # fmt: skip
    want = Counter(run for run, _, _ in expected.stored)
    wait_until("every valid fuzz record to be stored",
               lambda: _stored_by_run(serve, want) == want, 30,
               detail=lambda: f"{_stored_by_run(serve, want)} vs {want}")  # fmt: skip
    assert serve.stop() == 0
    valid = compare(read_store(serve.data, VALID_RUN), read_jsonl(logs / VALID_RUN))
    report(
        kind="input", what=f"{expected.messages} fuzz messages (hypothesis + mutations) and "
        f"{OVERSIZED} oversized frames while 2 ranks publish",
        result=f"serve up; rejections counted exactly by reason {dict(expected.reasons)}; "
        f"{len(expected.stored)} valid fuzz records stored", seconds=round(sent_s, 1),
        valid_run=valid,
    )  # fmt: skip
    assert valid == {**valid, "missing": 0, "extra": 0, "differ": 0}


def _stored_by_run(serve: Any, want: Counter[str]) -> Counter[str]:
    runs = serve.get("/api/runs")["runs"]
    return Counter({r["run"]: r.get("records") or 0 for r in runs if r["run"] in want})
