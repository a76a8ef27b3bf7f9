"""The hardware section in real headless Chromium against a real `rankwatch serve`, fed over
ZeroMQ like agents: a hot, throttled card and a slow node among 32 cards on four nodes. The hot
card's line is highlighted on its chart, the node reads as one node, the rank table has the
hardware columns, and at phone size (390x844) nothing overflows sideways. Screenshots at both
sizes go to test-artifacts/ (or $RANKWATCH_ARTIFACTS)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import Record, StepRecord, TelemetryRecord

from .procs import Server

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
from playwright.sync_api import Browser, Page

from .test_browser import (  # noqa: F401 - the fixtures, shared with the page's other tests
    READY_TIMEOUT_MS,
    Watched,
    open_run,
    pytestmark,
    server,
)

RUN = "hw32"
WORLD = 32  # four nodes of eight: the most a chart draws one by one
DESKTOP = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}


def card(rank: int, seq: int, t: float) -> TelemetryRecord:
    hot, slow_node = rank == 5, 8 <= rank < 16
    values = {
        "gpu/temp_c": 94.0 if hot else 63.0 + (rank * 7 % 5) * 0.8,
        "gpu/sm_clock_mhz": 1350.0 if hot else (1150.0 if slow_node else 1980.0) + rank % 3,
        "gpu/util_pct": 96.0 - rank % 4,
        "gpu/mem_used_bytes": (60 + rank % 3) * 2.0**30,
        "gpu/mem_total_bytes": 80 * 2.0**30,
        "gpu/power_w": 430.0 if slow_node else 650.0 + rank,
        "gpu/throttle_mask": float(0x40 | 0x80) if hot else 0.0,
        "host/cpu_pct": 35.0 + rank // 8,
    }
    labels = {"gpu/throttle": "sw_thermal,hw_thermal"} if hot else {}
    return TelemetryRecord(RUN, rank, seq, t, f"node{rank // 8}", 4000 + rank, "gpu",
                           f"gpu:{rank % 8}", values, labels)  # fmt: skip


def feed(srv: Server) -> None:
    ctx = zmq.Context()
    try:
        socks = []
        for _ in range(WORLD):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(f"tcp://{srv.ingest}")
            socks.append(sock)
        seq = [0] * WORLD
        now = time.time()
        for i in range(12):  # two minutes of samples at 10 s, each rank at its own phase
            for rank in range(WORLD):
                seq[rank] += 1
                t = now - 120 + 10 * i + 0.4 * rank
                recs: list[Record] = [card(rank, seq[rank], t)]
                seq[rank] += 1
                metrics = {"loss": 2.0 / (1 + 0.1 * i), "step_time": 1.0 + 0.01 * rank}
                recs.append(StepRecord(RUN, rank, seq[rank], t, WORLD, f"node{rank // 8}",
                                       4000 + rank, i, 0, metrics))  # fmt: skip
                for rec in recs:  # telemetry rides frames of its own (schema version 2)
                    socks[rank].send(records.encode_frame([rec]))
        for sock in socks:
            sock.close()
    finally:
        ctx.term()


def hardware_ready(page: Page) -> None:
    page.wait_for_function(
        "() => window.rankwatch.hardware && window.rankwatch.hardware.ready"
        " && window.rankwatch.hardware.charts.size > 0",
        timeout=READY_TIMEOUT_MS,
    )


def temp_lines(page: Page) -> dict[str, Any]:
    return page.evaluate(
        "() => Object.fromEntries(window.rankwatch.hardware.charts.get('gpu/temp_c').chart"
        ".getOption().series.filter((s) => String(s.id).startsWith('r:'))"
        ".map((s) => [s.id, {width: s.lineStyle.width, n: s.data.length}]))"
    )


def test_hardware_section_at_desktop_and_phone_size(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
) -> None:
    feed(server)

    def found() -> bool:
        hw = server.get("/api/run/telemetry", run=RUN)
        rules = {(f["rule"], f["rank"], f["host"]) for f in hw.get("findings", [])}
        return {("hw_hot", 5, ""), ("hw_node", None, "node1")} <= rules

    server.wait_for("the hot card and the slow node", found)

    def stored() -> bool:  # the findings are live; the charts read the store, flushed apart
        got = server.get("/api/run/telemetry", run=RUN, metric="gpu/temp_c")
        series = got.get("series", {})
        return len(series) == WORLD and all(len(s["time"]) == 12 for s in series.values())

    server.wait_for("every card's 12 samples stored", stored)
    for size, tag in ((DESKTOP, "desktop"), (PHONE, "phone")):
        context = browser.new_context(viewport=size)
        w = Watched(context.new_page())
        page = open_run(w, server, RUN)
        hardware_ready(page)
        page.wait_for_function("() => !document.getElementById('hardware').hidden")
        titles = page.evaluate(
            "() => [...document.querySelectorAll('#hw-charts .hw-chart')]"
            ".map((c) => c.dataset.metric)"
        )
        assert titles[:3] == ["gpu/temp_c", "gpu/sm_clock_mhz", "gpu/util_pct"]
        assert "gpu/throttle_mask" not in titles and "host/cpu_pct" in titles
        lines = temp_lines(page)
        assert len(lines) == WORLD and all(v["n"] == 12 for v in lines.values())
        # node1's 8 slow cards share one line on the clock chart: a few end labels, not a pile
        labels = page.evaluate(
            "() => window.rankwatch.hardware.charts.get('gpu/sm_clock_mhz').chart.getOption()"
            ".series.filter((s) => s.endLabel && s.endLabel.show).map((s) => s.id)"
        )
        assert labels == ["r:5", "r:8", "r:9"], labels
        at = page.locator("#hw-charts .hw-chart .step-tag").first.text_content() or ""
        assert re.fullmatch(r" at \d\d:\d\d:\d\d", at), at  # 24-hour, as the axis
        assert lines["r:5"]["width"] > max(v["width"] for k, v in lines.items() if k != "r:5")
        nodes = page.evaluate(
            "() => [...document.querySelectorAll('.hw-node')].map((n) => [n.dataset.host,"
            " n.classList.contains('faulty'), [...n.querySelectorAll('.hw-card.flagged')]"
            ".map((c) => c.textContent)])"
        )
        slow = [str(r) for r in range(8, 16)]  # one tile marked as the fault, its cards red
        assert nodes == [["node0", False, ["5"]], ["node1", True, slow], ["node2", False, []],
                         ["node3", False, []]]  # fmt: skip
        findings = page.locator("#hw-findings").inner_text()
        assert "rank 5 (gpu:5 on node0)" in findings and "node node1: 8 of 8 cards" in findings
        row5 = page.evaluate(
            "() => [...document.querySelector('#rank-body tr[data-rank=\"5\"]')"
            ".querySelectorAll('td.hw-col')].map((td) => [td.textContent, td.className])"
        )
        assert row5[0] == ["94 °C", "hw-col zbad"] and row5[2][0] == "62.0 / 80 GiB"
        heads = page.evaluate("() => [...document.querySelectorAll('#rank-head th.hw-col')]"
                              ".map((th) => th.textContent)")  # fmt: skip
        assert heads == ["temp", "util", "memory"]
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{tag}: {overflow} px of horizontal overflow"
        page.locator("#hardware").scroll_into_view_if_needed()
        page.screenshot(path=artifacts / f"hardware-{tag}.png", full_page=True)
        page.locator("#hardware").screenshot(path=artifacts / f"hardware-section-{tag}.png")
        assert w.errors == [], w.errors
        context.close()
    status = subprocess.run(
        [sys.executable, "-m", "rankwatch.cli.main", "status", "--url", server.url, "--run", RUN],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    tail = status.stdout[status.stdout.index("hardware of hw32") :].splitlines()
    assert tail[0] == "hardware of hw32: 32 cards on 4 node(s), sampled every 10 s"
    assert any(x.startswith("  hottest: rank 5 (gpu:5 on node0)") for x in tail), status.stdout
    assert any(x.startswith("  hw_node: node node1: 8 of 8 cards (ranks 8-15)") for x in tail), (
        status.stdout
    )


def test_real_host_telemetry_from_a_monitor_reaches_the_page(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
    tmp_path: Path,
) -> None:
    """psutil's values on this machine, sampled by a real Monitor, over ZeroMQ to the serve."""
    from rankwatch.agent.monitor import Monitor

    mons = [
        Monitor(run="host-real", rank=rank, world_size=2, addr=server.ingest,
                log_dir=tmp_path / "logs", telemetry="host,1s")
        for rank in range(2)
    ]  # fmt: skip
    try:
        for step in range(40):
            for mon in mons:
                mon.log(step, loss=1.0 / (1 + step))
            time.sleep(0.1)

        def stored() -> bool:  # as above: the charts read the store, which flushes apart
            hw = server.get("/api/run/telemetry", run="host-real")
            names = {m["name"] for m in hw.get("metrics", [])}
            got = server.get("/api/run/telemetry", run="host-real", metric="host/rss_bytes")
            series = got.get("series", {})
            return (
                {"host/cpu_pct", "host/rss_bytes"} <= names
                and len(series) == 2
                and all(len(s["time"]) >= 2 for s in series.values())
            )

        server.wait_for("host telemetry of both ranks", stored)
    finally:
        for mon in mons:
            mon.close()
    context = browser.new_context(viewport=DESKTOP)
    w = Watched(context.new_page())
    page = open_run(w, server, "host-real")
    hardware_ready(page)
    rss = page.evaluate(
        "() => window.rankwatch.hardware.charts.get('host/rss_bytes').chart.getOption()"
        ".series.filter((s) => String(s.id).startsWith('r:')).map((s) => s.data.length)"
    )
    assert len(rss) == 2 and min(rss) >= 2
    page.locator("#hardware").screenshot(path=artifacts / "hardware-host-real-desktop.png")
    assert w.errors == [], w.errors
    context.close()
