"""A backlog longer than a step's grace: the aggregator's lock is held while 64 relay-shaped
connections (a node's 8 ranks in each frame) queue 50 steps each over real ZeroMQ, more than one
receive batch, which the receiver then drains peer by peer. Every step is merged whole: the grace
for a step's slowest rank counts up to what ingest has taken in, not the clock, so no value is
late and no step is scored partial for the head node's own lag. (Counted on the clock, the
first batch's steps were handed out partial before the second batch was read.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.service import Aggregator, ServeConfig

from tests.polling import wait_until

RUN = "backlog"
NODES, PER_NODE, STEPS = 64, 8, 50
WORLD = NODES * PER_NODE


def node_frame(node: int, step: int) -> bytes:
    return records.encode_frame([
        StepRecord(
            run=RUN, rank=rank, seq=step + 1, time=1000.0 + step, world_size=WORLD,
            host=f"node{node}", pid=100 + rank, step=step, epoch=None,
            metrics={"loss": 2.0 - 0.01 * step + 0.001 * rank, "grad_norm": 1.0},
        )
        for rank in range(node * PER_NODE, (node + 1) * PER_NODE)
    ])  # fmt: skip


@pytest.mark.timeout(90)
def test_steps_queued_behind_a_backlog_longer_than_their_grace_are_merged_whole(
    tmp_path: Path,
) -> None:
    config = ServeConfig(data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
                         console_alerts=False, merge_grace_s=0.2)  # fmt: skip
    agg = Aggregator(config)
    agg.start()
    ctx = zmq.Context()
    socks = []
    try:
        for _ in range(NODES):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{agg.ingest_port}")
            socks.append(sock)
        time.sleep(0.5)  # connected before the hold
        frames = [[node_frame(n, s) for s in range(STEPS)] for n in range(NODES)]
        with agg.lock:  # ingest waits; the relays send everything meanwhile
            for sock, mine in zip(socks, frames, strict=True):
                for frame in mine:
                    sock.send(frame)
            time.sleep(1.0)  # all of it in the socket, past the grace many times over
        want = NODES * PER_NODE * STEPS
        wait_until(lambda: agg.counters()["records_accepted"] >= want, 60)
        # taken in; then the grace, counted up to what was taken in, passes too
        wait_until(lambda: agg.merger.open_groups() == 0, 10)
        counts = agg.counters()
        assert counts["records_accepted"] == want
        # every value reached its step before the step was handed out: a step handed out
        # partial would have made the rest of its values late
        assert counts["merge_late"] == 0 and counts["merge_evicted"] == 0, counts
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()
        agg.stop()
