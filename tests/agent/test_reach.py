"""The rank's log says when nothing answers at the aggregator's address, and when it does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent import reach
from rankwatch.agent.reach import Reachability

from tests import polling


def test_one_warning_per_outage_and_one_line_when_it_answers() -> None:
    jsonl = Path("logs/run/rank0.jsonl")
    r = Reachability("tcp://10.0.0.9:8671", jsonl, after_s=30.0, now=100.0)
    assert r.tick(129.9) is None
    said = r.tick(130.0)
    assert said == (
        "rankwatch: nothing reachable at tcp://10.0.0.9:8671 after 30 s (no ZeroMQ handshake): "
        f"records go to the JSONL file {jsonl} only until an aggregator answers there"
    )
    assert r.tick(500.0) is None  # once
    assert r.handshake(542.0) == (
        "rankwatch: connected to the aggregator at tcp://10.0.0.9:8671 after 442 s; "
        "records are sent again"
    )
    assert r.tick(1000.0) is None  # connected: nothing to say
    r.disconnected(1000.0)
    assert r.tick(1010.0) is None  # a short outage (an aggregator restart) is not news
    assert r.handshake(1011.0) is None  # and neither is its end
    r.disconnected(2000.0)
    assert r.tick(2030.0) is not None  # a new long outage is


def test_connected_before_the_delay_says_nothing() -> None:
    r = Reachability("tcp://h:1", None, after_s=30.0, now=0.0)
    assert r.handshake(1.0) is None
    assert r.tick(100.0) is None
    r2 = Reachability("tcp://h:1", None, after_s=1.0, now=0.0)
    assert "memory only (no JSONL)" in (r2.tick(2.0) or "")


def test_a_real_monitor_at_a_closed_port_says_so_then_says_when_it_connects(
    make_monitor: Any,
    free_port: Any,
    router_at: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reach, "UNREACHABLE_AFTER_S", 0.3)
    caplog.set_level(logging.WARNING, logger="rankwatch.agent")
    port = free_port()
    mon = make_monitor(addr=f"127.0.0.1:{port}", heartbeat_s=0.1)
    mon.log(1, loss=1.0)

    def said(words: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if words in r.getMessage()]

    polling.wait_until(lambda: said("nothing reachable"), 5.0, what="the warning")
    (warning,) = said("nothing reachable")
    assert f"nothing reachable at tcp://127.0.0.1:{port}" in warning
    assert f"records go to the JSONL file {mon.jsonl_path} only" in warning
    assert caplog.records[-1].name == "rankwatch.agent"

    router = router_at(port)  # the aggregator appears
    router.wait_for(lambda recs: any(getattr(r, "step", None) == 1 for r in recs))
    polling.wait_until(lambda: said("connected to the aggregator"), 5.0, what="connected")
    (connected,) = said("connected to the aggregator")
    assert f"at tcp://127.0.0.1:{port}" in connected
    mon.close()
    assert len(said("nothing reachable")) == 1
