"""The incident card's timeline items (dashboard/static/incidents.js), run by node on the page's
own files: one rank, a group of ranks alike in it, and an item stored before groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .nodejs import needs_node, run_module

pytestmark = needs_node


def run_js(tmp_path: Path, body: str) -> Any:
    return run_module(
        tmp_path,
        ("incidents.js", "util.js"),
        "import { evidenceRanks } from './incidents.js';",
        body,
    )


def test_a_group_says_how_many_ranks_and_which(tmp_path: Path) -> None:
    out = run_js(
        tmp_path,
        "{"
        "one: evidenceRanks({rank: 2, count: 1, ranks: []}),"
        "old: evidenceRanks({rank: 2, what: 'loss non-finite'}),"  # stored before groups
        "group: evidenceRanks({rank: 0, count: 4095, ranks: [[0, 1364], [1366, 4095]]}),"
        "cut: evidenceRanks({rank: 0, count: 9, ranks: [[0, 0], [2, 2], [4, 4]]}),"
        "bad: evidenceRanks({rank: 0, count: 3, ranks: [['x', 1], [1], 'y']}),"
        "}",
    )
    assert out["one"] == out["old"] == {"who": "rank 2", "which": ""}
    assert out["group"] == {"who": "4095 ranks", "which": " (ranks 0-1364, 1366-4095)"}
    assert out["cut"] == {"who": "9 ranks", "which": " (ranks 0, 2, 4, …)"}  # more than listed
    assert out["bad"] == {"who": "3 ranks", "which": ""}
