"""1,024 ranks of telemetry with injected hardware faults through the wired aggregator (its
real store, alert engine and node grouping): the faulty card or node is named and no other."""

from __future__ import annotations

import time
from pathlib import Path

from rankwatch.aggregator.service import Aggregator, ServeConfig
from telemetry_fleet import DEFAULT_FAULTS, Fleet, expected, run


def test_at_1024_ranks_each_fault_names_its_card_or_node_and_no_other(tmp_path: Path) -> None:
    cfg = ServeConfig(data_dir=tmp_path / "data", console_alerts=False, resend_gaps=False)
    agg = Aggregator(cfg)
    try:
        fleet = Fleet(1024, DEFAULT_FAULTS, seed=3)
        named: set[tuple[str, int | str]] = set()
        for i in range(14):
            agg.add(fleet.sample(i), imported=False)
            for alert in agg.tick():
                if alert.state == "firing":
                    where = alert.rank if alert.rank is not None else alert.metric or ""
                    named.add(
                        (alert.rule, where.split("@")[-1] if isinstance(where, str) else where)
                    )
        assert named == expected(DEFAULT_FAULTS)
        node = next(a for a in agg.alerts.firing() if a.rule == "hw_node")
        assert node.message.startswith("node node090: 8 of 8 cards (ranks 720-727) slower-clocked")
        assert node.message.endswith("% of its peers' power")  # it draws less power too
        assert agg.flush_store()
        assert agg.store.telemetry_runs()["fleet"]["ranks"] == 1024
    finally:
        agg.stop()


def test_clean_telemetry_at_1024_ranks_raises_no_flag() -> None:
    t0 = time.perf_counter()
    res = run(1024, 20, (), seed=5)
    assert res["onsets"] == 0 and res["named"] == set()
    assert time.perf_counter() - t0 < 60
