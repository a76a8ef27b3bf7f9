"""The reference overlay's pure parts (dashboard/static/refrun.js), run by node on the page's own
files: the reference's points clipped to this run's steps, its value at a tooltip's step, and the
comparison line under a chart's title."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .nodejs import needs_node, run_module

pytestmark = needs_node


def run_js(tmp_path: Path, body: str) -> Any:
    return run_module(
        tmp_path,
        ("refrun.js", "util.js"),
        "import { clipToSteps, compareText, refAt } from './refrun.js';",
        body,
    )


def test_clip_refat_and_the_comparison_line(tmp_path: Path) -> None:
    line = "{steps: [0, 10, 20, 30, 40], values: [5, 4, 3, 2, 1]}"
    last = "{step: 20, run: 0.8, ref: 1.0, ratio: 0.8}"
    out = run_js(
        tmp_path,
        "{"
        f"clip: clipToSteps({line}, 12, 25),"  # one point beyond each end
        f"clipAll: clipToSteps({line}, -5, 99),"
        f"clipNone: clipToSteps(null, 0, 10),"
        f"clipEmpty: clipToSteps({line}, Infinity, -Infinity),"
        f"at: [refAt({line}, 25), refAt({line}, 30), refAt({line}, -1), refAt({line}, 99)],"
        f"text: compareText('loss', 'train-a', {{last: {last}}}, true),"
        f"up: compareText('loss', 'r', {{last: {{step: 5, run: 2, ref: 1, ratio: 2}}}}, true),"
        "zero: compareText('loss', 'r', {last: {step: 5, run: 2, ref: 0, ratio: null}}, true),"
        "none: compareText('loss', 'r', {last: null, ref_last_step: 9}, true),"
        "missing: compareText('data_time', 'train-a', null, false),"
        "pending: compareText('loss', 'train-a', undefined, true)"
        "}",
    )
    assert out["clip"] == {"steps": [10, 20, 30], "values": [4, 3, 2]}
    assert out["clipAll"]["steps"] == [0, 10, 20, 30, 40]
    assert out["clipNone"] == out["clipEmpty"] == {"steps": [], "values": []}
    assert out["at"] == [{"step": 20, "value": 3}, {"step": 30, "value": 2}, None,
                         {"step": 40, "value": 1}]  # fmt: skip
    assert out["text"] == "ref: train-a · step 20: this run 0.8 (-20.0%), ref 1"
    assert out["up"] == "ref: r · step 5: this run 2 (+100.0%), ref 1"
    assert out["zero"] == "ref: r · step 5: this run 2, ref 0"  # no ratio against 0
    assert out["none"] == "ref: r · no step in common with this run yet (ref's last step 9)"
    assert out["missing"] == "ref: train-a has no data_time data, nothing to overlay"
    assert out["pending"] == "ref: train-a"
