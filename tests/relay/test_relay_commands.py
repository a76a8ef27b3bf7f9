"""A stop through a per-node relay: the head's command reaches each rank behind the relay (it
routes on run and rank), and the ranks' answers come back the same way. The two ranks step in
lockstep (a barrier plays the collective), so a rank leaving a step early would leave the other
waiting: they must leave after the same step."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rankwatch.agent.monitor import Monitor
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.relay.forwarder import Relay

RUN = "relayed"
WORLD = 2


def test_a_stop_through_a_relay(tmp_path: Path) -> None:
    config = ServeConfig(data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
                         flush_interval_s=0.05, console_alerts=False)  # fmt: skip
    with Aggregator(config) as agg:
        relay = Relay("tcp://127.0.0.1:0", f"tcp://127.0.0.1:{agg.ingest_port}")
        relay.start()
        stopped: dict[int, int] = {}
        halt = threading.Event()
        collective = threading.Barrier(WORLD, timeout=5.0)  # broken: a rank waited alone

        def train(rank: int) -> None:
            with Monitor(RUN, rank, WORLD, f"127.0.0.1:{relay.port}", tmp_path / "logs",
                         accept="stop") as mon:  # fmt: skip
                for step in range(1, 5000):
                    try:
                        collective.wait()
                    except threading.BrokenBarrierError:  # the test is over (aborted below)
                        return
                    mon.log(step, loss=1.0)
                    if mon.should_stop(step):
                        stopped[rank] = step
                        return
                    if halt.wait(0.03):
                        return

        threads = [threading.Thread(target=train, args=(r,), daemon=True) for r in range(WORLD)]
        try:
            for t in threads:
                t.start()
            deadline = time.monotonic() + 15
            while len(agg.snapshot(run=RUN)["runs"][0]["ranks"] if agg.snapshot(run=RUN)["runs"]
                       else []) < WORLD:  # fmt: skip
                assert time.monotonic() < deadline, "the ranks never showed"
                time.sleep(0.05)
            cmd = agg.issue_command(RUN, "stop", by="test")
            deadline = time.monotonic() + 30
            while (state := agg.commands_of(RUN)[0]["state"]) not in ("done", "aborted"):
                assert time.monotonic() < deadline, agg.commands_of(RUN)
                time.sleep(0.05)
            if state == "aborted":  # a head too slow to hear every rank in time: none stops
                time.sleep(0.5)
                assert stopped == {}, agg.commands_of(RUN)
                return
            for t in threads:
                t.join(15)
            # both left after the step the command named: none waits alone in the barrier
            assert stopped == {0: agg.commands_of(RUN)[0]["step"], 1: stopped[0]}
            assert stopped[0] >= cmd["step"] and agg.counters()["control_sent"] >= 2 * WORLD
        finally:
            halt.set()
            collective.abort()
            for t in threads:
                t.join(15)
            relay.stop(timeout_s=1.0)
