"""Policies: parsing (TOML and --policy), matching incidents, the stop step agreement."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.actions.agree import stop_step, typical_step_time
from rankwatch.aggregator.actions.policy import (
    Case,
    PolicyEngine,
    PolicyError,
    parse_rules,
    parse_spec,
)
from rankwatch.aggregator.config import ConfigError, parse_config, with_overrides
from rankwatch.aggregator.service import ServeConfig


def case(cause: str = "nonfinite", step: int | None = 20, firing: bool = True, id: str = "r#1"):
    return Case(id, "r", cause, step, firing, "rank 2 went non-finite", (2,))


def test_presets_and_specs() -> None:
    (rule,) = parse_spec("stop-on-nan")
    assert rule.causes == {"nonfinite"} and rule.actions == ("checkpoint", "stop")
    (rule,) = parse_spec("divergence@200:notify")
    assert rule.after_steps == 200 and rule.actions == ("notify",)
    assert parse_spec("notify") == ()
    for bad, words in [
        ("explode", "expected a preset"),
        ("nonfinite:reboot", "unknown action"),
        ("gremlins:stop", "unknown cause"),
        ("nonfinite:stop+checkpoint", "in the order"),
    ]:
        with pytest.raises(PolicyError, match=words):
            parse_spec(bad)


def test_toml_rules_are_checked() -> None:
    raw = [{"name": "nan", "on": "nonfinite", "actions": ["checkpoint", "stop"]},
           {"on": ["divergence"], "after_steps": 1000, "actions": "stop"}]  # fmt: skip
    _, b = parse_rules(raw, "f.toml")
    assert b.name == "divergence@1000" and b.actions == ("stop",)
    for bad, words in [
        ([{"on": "nonfinite", "bogus": 1}], "unknown key"),
        ([{"actions": ["stop"]}], "'on' must be"),
        ([{"on": "nonfinite", "after_steps": -1}], "after_steps"),
        ([{"on": "nonfinite", "name": "a"}, {"on": "crash", "name": "a"}], "used twice"),
        ({"on": "nonfinite"}, "must be tables"),
    ]:
        with pytest.raises(PolicyError, match=words):
            parse_rules(bad, "f.toml")
    config = parse_config({"policy": raw}, "f.toml", ServeConfig())
    assert [r.name for r in config.policies] == ["nan", "divergence@1000"]
    with pytest.raises(ConfigError, match=r"f\.toml: policy 1: unknown cause"):
        parse_config({"policy": [{"on": "x"}]}, "f.toml", ServeConfig())
    flags = with_overrides(ServeConfig(), policies=["stop-on-nan", "crash:stop"])
    assert [r.name for r in flags.policies] == ["nonfinite", "crash"]
    with pytest.raises(ConfigError, match="--policy"):
        with_overrides(ServeConfig(), policies=["bad"])


def test_a_rule_fires_once_per_incident_and_waits_for_its_steps() -> None:
    engine = PolicyEngine(parse_spec("stop-on-nan") + parse_spec("divergence@100:stop"))
    (d,) = engine.decide([case()], {"r": 21})
    assert d.by == "policy:nonfinite" and d.at_step == 21 and "culprit rank 2" in d.reason
    assert engine.decide([case()], {"r": 22}) == []  # once
    assert len(engine.decide([case(id="r#2")], {"r": 22})) == 1  # another incident
    div = case("divergence", step=50, id="r#3")
    assert engine.decide([div], {"r": 149}) == []
    (d,) = engine.decide([div], {"r": 150})
    assert d.rule.name == "divergence@100"
    assert engine.decide([case(firing=False, id="r#4")], {"r": 30}) == []  # resolved
    assert PolicyEngine().decide([case()], {"r": 21}) == []  # default: nothing


def test_stop_step_is_ahead_of_every_rank() -> None:
    assert stop_step([10, 12, None, 11], None) == 12 + 10  # no step time yet: err long
    assert stop_step([], None) == 10
    assert stop_step([10], 0.1, behind_s=1.0) == 10 + 11  # the ranks went on since the report
    assert stop_step([10], 0.1, behind_s=1e9) == 10 + 301  # a clock far off: bounded
    assert stop_step([10], 0.01, lead_s=0.4) == 10 + 40  # fast steps: more margin
    assert stop_step([10], 1.0e-9) == 10 + 1000  # bounded
    assert stop_step([10], 5.0) == 12  # slow steps: the minimum
    assert typical_step_time([0.2, None, 0.4, 0.3]) == 0.3
    assert typical_step_time([None]) is None
