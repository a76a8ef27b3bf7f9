"""The table of known metrics, and the lists derived from it."""

from __future__ import annotations

from rankwatch.aggregator.alerts import console
from rankwatch.aggregator.divergence.config import DEFAULT_RULES, DivergenceConfig, MetricRule
from rankwatch.aggregator.metrics import BY_NAME, KNOWN_METRICS, display_order
from rankwatch.dashboard import views


def test_the_divergence_rules_are_the_tables() -> None:
    cfg = DivergenceConfig()
    for m in KNOWN_METRICS:
        rule = cfg.rule(m.name)
        assert rule.direction == m.direction, m.name
        assert rule.high_ratio == (cfg.high_ratio if m.high_ratio is None else m.high_ratio)
        assert rule.low_ratio == (cfg.low_ratio if m.low_ratio is None else m.low_ratio)
        assert rule.rel_floor == (cfg.rel_floor if m.rel_floor is None else m.rel_floor)
        assert rule.pair_ratio == (cfg.pair_ratio if m.pair_ratio is None else m.pair_ratio)
        assert rule.abs_floor == (cfg.abs_floor if m.abs_floor is None else m.abs_floor)
        assert rule.offset_steps == m.offset_steps, m.name
    assert set(DEFAULT_RULES) <= set(BY_NAME)
    # the rules as they were written out before the table: scoring is unchanged (plus the
    # persistent-offset test of the local gradient norm)
    assert {
        "grad_norm_local": MetricRule("both", offset_steps=16),
        "throughput": MetricRule("low"),
        "step_time": MetricRule("high"),
        "data_time": MetricRule("high", high_ratio=2.0, rel_floor=0.25, abs_floor=0.01),
        "loss_scale": MetricRule("off"),
        "lr": MetricRule(
            "both", high_ratio=1.0001, low_ratio=0.9999, rel_floor=1e-6, pair_ratio=1.0001
        ),
    } == DEFAULT_RULES


def test_the_display_orders_are_the_tables() -> None:
    placed = sorted((m for m in KNOWN_METRICS if m.order is not None), key=lambda m: m.order or 0)
    order = tuple(m.name for m in placed)
    assert display_order() == order == views.METRIC_ORDER == console.PREFERRED_METRICS
    assert order == ("loss", "lr", "throughput", "step_time", "grad_norm", "loss_scale")
    assert len({m.order for m in placed}) == len(placed)  # no two metrics share a place


def test_names_are_unique_and_directions_known() -> None:
    assert len(BY_NAME) == len(KNOWN_METRICS)
    assert all(m.direction in ("both", "high", "low", "off") for m in KNOWN_METRICS)
