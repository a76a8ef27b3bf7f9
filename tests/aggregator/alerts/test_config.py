"""Alert settings: the ``[alerts]`` table, every mistake named by its key."""

from __future__ import annotations

from typing import Any

import pytest
from rankwatch.aggregator.alerts.config import AlertConfig, ThresholdRule


def test_from_dict_full_example() -> None:
    cfg = AlertConfig.from_dict(
        {
            "thresholds": [{"metric": "loss", "op": ">", "value": 10, "steps": 2}],
            "plateau": False,
            "throughput_drop": {"fraction": 0.3},
            "group_ranks": 16,
        }
    )
    assert cfg.thresholds == (ThresholdRule("loss", ">", 10, steps=2),)
    assert cfg.plateau is None and cfg.throughput_drop is not None
    assert cfg.throughput_drop.fraction == 0.3 and cfg.group_ranks == 16


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"tresholds": []}, "'tresholds'"),
        ({"thresholds": [{"metric": "loss", "op": "=>", "value": 1}]}, "threshold.op"),
        ({"thresholds": [{"metric": "loss", "op": ">"}]}, "thresholds\\[0\\].*value"),
        ({"thresholds": [{"metric": "loss", "op": ">", "value": "x"}]}, "thresholds\\[0\\].value"),
        (
            {"thresholds": [{"metric": "loss", "op": ">", "value": 1, "when": 2}]},
            "thresholds\\[0\\].when",
        ),
        ({"plateau": {"steps": 0}}, "plateau.steps"),
        ({"plateau": {"steps": 2.5}}, "plateau.steps: must be an integer"),
        ({"plateau": {"metric": 3}}, "plateau.metric: must be a string"),
        ({"plateau": {"mode": "best"}}, "plateau.mode"),
        ({"throughput_drop": {"fraction": 1.5}}, "throughput_drop.fraction"),
        ({"disabled": ["divergance"]}, "'divergance'"),
        ({"severity": {"lost": "panic"}}, "severity.lost"),
        ({"group_ranks": 0}, "group_ranks"),
        ({"group_ranks": "8"}, "group_ranks"),
    ],
)
def test_from_dict_errors_name_the_key(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AlertConfig.from_dict(raw)
