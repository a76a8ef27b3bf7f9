"""An alert's words: the same for an Alert and for its dict form (what the feed carries)."""

from __future__ import annotations

import json
import math

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.words import alert_dict, alert_line, title_of

LOST = Alert(
    "lost|r|2|", "lost", "critical", "firing", "r", 2, None, 100, 0.0, 60.0, None,
    "rank 2 (node1) no record for 60 s",
)  # fmt: skip
PLATEAU = Alert(
    "plateau|r||loss", "plateau", "info", "resolved", "r", None, "loss", None, 0.0, 1.0, math.nan,
    "resolved: loss has not improved",
)  # fmt: skip


def test_one_line_says_state_severity_where_and_since() -> None:
    assert alert_line(alert_dict(LOST)) == (
        "FIRING [critical] run r, rank 2: rank 2 (node1) no record for 60 s (since step 100)"
    )
    assert alert_line(alert_dict(PLATEAU)) == (
        "RESOLVED [info] run r, loss: resolved: loss has not improved"
    )


def test_the_dict_form_is_strict_json_and_reads_the_same() -> None:
    d = alert_dict(PLATEAU)
    assert d["value"] == "NaN" and d["ranks"] == []
    again = json.loads(json.dumps(d, allow_nan=False))
    assert alert_line(again) == alert_line(d)


def test_titles() -> None:
    assert title_of([alert_dict(LOST)]) == "rankwatch FIRING: lost"
    assert title_of([alert_dict(LOST), alert_dict(PLATEAU)]) == "rankwatch: 1 firing, 1 resolved"


def test_a_crash_alert_is_one_line_and_its_dict_keeps_the_whole_text() -> None:
    stack = "\n".join(["", "----------", "- C++ Call Stack: (For framework developers)",
                       "----------", "mindspore/ccsrc/kernel.cc:12 Launch"])  # fmt: skip
    crash = Alert(
        "crashed|r|1|", "crashed", "critical", "firing", "r", 1, None, 20, 0.0, 1.0, None,
        f"rank 1 (node0) crashed: builtins.RuntimeError: Launch kernel failed, name:Default/"
        f"grad_reducer/AllReduce-op2{stack} at step 20",
    )  # fmt: skip
    assert alert_line(alert_dict(crash)) == (
        "FIRING [critical] run r, rank 1: rank 1 (node0) crashed: RuntimeError: Launch kernel "
        "failed, name:Default/grad_reducer/AllReduce-op2 (since step 20)"
    )
    assert "C++ Call Stack" in alert_dict(crash)["message"]
