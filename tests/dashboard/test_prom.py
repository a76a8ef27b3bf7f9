"""Prometheus exposition from a snapshot: escaping, non-finite values, counters."""

from __future__ import annotations

import math

from rankwatch.dashboard import prom

SNAPSHOT = {
    "runs": [
        {
            "run": 'we"ird\\run\nname',
            "state": "running",
            "world_size": 2,
            "last_time": 123.5,
            "last_step": 10,
            "ranks": [
                {
                    "rank": 0,
                    "state": "alive",
                    "last_step": 10,
                    "last_seen": 123.0,
                    "throughput": 55.0,
                    "dropped": 0,
                    "gaps": [[3, 4]],
                    "values": {"loss": 0.5, "grad_norm": math.nan},
                    "z": {"loss": -0.3},
                    "divergent": [],
                },
                {
                    "rank": 1,
                    "state": "alive",
                    "values": {"loss": math.inf},
                    "z": {"loss": "NaN"},
                    "divergent": ["loss"],
                },
            ],
            "divergences": [{"rank": 1, "metric": "loss"}],
        }
    ]
}


def test_render_escapes_and_formats() -> None:
    text = prom.render(SNAPSHOT, {"frames received": 7, "decode_errors": {"field": 2}}, 1)
    label = 'run="we\\"ird\\\\run\\nname"'
    assert f'rankwatch_metric_last{{{label},rank="0",metric="loss"}} 0.5' in text
    assert f'rankwatch_metric_last{{{label},rank="0",metric="grad_norm"}} NaN' in text
    assert f'rankwatch_metric_last{{{label},rank="1",metric="loss"}} +Inf' in text
    assert f'rankwatch_divergence_z{{{label},rank="1",metric="loss"}} NaN' in text
    assert f'rankwatch_rank_divergent{{{label},rank="1",metric="loss"}} 1.0' in text
    assert f'rankwatch_rank_state{{{label},rank="0",state="alive"}} 1.0' in text
    assert f'rankwatch_rank_sequence_gaps{{{label},rank="0"}} 1.0' in text
    assert "rankwatch_alerts_firing 1.0" in text
    assert "rankwatch_aggregator_frames_received 7.0" in text
    assert 'rankwatch_aggregator_decode_errors{kind="field"} 2.0' in text
    # every sample line is "name{labels} value" with no raw newline inside a label
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_and_labels, _, value = line.rpartition(" ")
            assert name_and_labels.startswith("rankwatch_")
            float(value.replace("+Inf", "inf").replace("-Inf", "-inf"))
    assert text.count("# TYPE rankwatch_metric_last gauge") == 1


def test_metric_name_sanitised() -> None:
    assert prom.metric_name("9 lives-left") == "rankwatch_aggregator__9_lives_left"
    assert prom.metric_name("!!!") == "rankwatch_aggregator_unnamed"
