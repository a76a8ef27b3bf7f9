"""`rankwatch status`'s hardware lines, from the provider's answer over a real aggregator."""

from __future__ import annotations

import random
from pathlib import Path

from rankwatch.agent.wire.records import TelemetryRecord
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.aggregator.telemetry.cards import status_lines


def test_the_hottest_slowest_and_a_node_in_a_few_lines(tmp_path: Path) -> None:
    agg = Aggregator(ServeConfig(data_dir=tmp_path, console_alerts=False, resend_gaps=False))
    rnd = random.Random(2)
    try:
        for i in range(8):
            recs = []
            for rank in range(32):
                values = {
                    "gpu/temp_c": (92.0 if rank == 3 else 65.0) + rnd.gauss(0, 1),
                    "gpu/sm_clock_mhz": (1100.0 if rank >= 24 else 1980.0) + rnd.gauss(0, 5),
                    "gpu/util_pct": 95.0 + rnd.gauss(0, 1),
                }
                recs.append(TelemetryRecord("j", rank, i + 1, 1e6 + 10 * i + rank * 0.2,
                                            f"h{rank // 8}", 1, "gpu", f"gpu:{rank % 8}",
                                            values, {}))  # fmt: skip
            agg.add(recs, imported=False)
            agg.tick()
        lines = status_lines(AggregatorProvider(agg).hardware("j"))
    finally:
        agg.stop()
    again = Aggregator(ServeConfig(data_dir=tmp_path, console_alerts=False, resend_gaps=False))
    try:  # a later serve: no live cards, the latest stored values
        stored = AggregatorProvider(again).hardware("j")
    finally:
        again.stop()
    assert len(stored["ranks"]) == 32 and stored["ranks"][3]["temp"] > 88
    assert stored["findings"] == [] and list(stored["nodes"]) == ["h0", "h1", "h2", "h3"]
    assert stored["ranks"][13]["device"] == "gpu:5"
    assert lines[0] == "hardware of j: 32 cards on 4 node(s), sampled every 10 s"
    hottest = next(x for x in lines if x.startswith("  hottest: "))
    assert hottest.startswith("  hottest: rank 3 (gpu:3 on h0): GPU temperature 9")
    assert hottest.endswith("[flagged]")
    slowest = next(x for x in lines if x.startswith("  slowest clock: "))
    assert slowest.startswith("  slowest clock: rank 2")  # one of the node's cards
    assert any(x.startswith("  hw_node: node h3: 8 of 8 cards (ranks 24-31)") for x in lines)
    assert len(lines) <= 8


def test_a_run_without_telemetry_has_no_lines_and_a_quiet_one_says_so() -> None:
    assert status_lines({"ranks": {}}) == []
    quiet = {"run": "q", "ranks": {0: {}}, "nodes": {"h": [0]}, "interval_s": 10.0}
    assert status_lines(quiet)[1] == "  every card is in line with its peers"
