"""Rank tables on the live stream go out as what changed: the delta logic as a table of cases,
the page's merge of a delta (the real util.js under node), and a real stream from a real
aggregator over uvicorn, where a run that is over costs its page nothing after its last change."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from rankwatch.aggregator.feed import ranks_delta
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.dashboard.app import STATIC_DIR, create_app

from .conftest import Records
from .test_live import READ_TIMEOUT_S, events, serve


def _rank(rank: int, state: str = "alive", **fields: Any) -> dict[str, Any]:
    return {"rank": rank, "state": state, "last_step": 5, "message": "", **fields}


@pytest.mark.parametrize(
    ("prev", "new", "changed", "removed"),
    [
        ([_rank(0), _rank(1)], [_rank(0), _rank(1)], [], []),
        ([_rank(0), _rank(1)], [_rank(0), _rank(1, last_step=6)], [_rank(1, last_step=6)], []),
        ([_rank(0)], [_rank(0), _rank(1)], [_rank(1)], []),
        ([_rank(0), _rank(1)], [_rank(1)], [], [0]),
        # a lost rank's message restates the clock: not a change while it stays lost
        (
            [_rank(0, "lost", message="no record for 11 s")],
            [_rank(0, "lost", message="no record for 13 s")],
            [],
            [],
        ),
        # ... but the state turning lost, or anything else of a lost rank, is one
        ([_rank(0)], [_rank(0, "lost")], [_rank(0, "lost")], []),
        (
            [_rank(0, "lost")],
            [_rank(0, "lost", last_step=9, message="x")],
            [_rank(0, "lost", last_step=9, message="x")],
            [],
        ),
        # a live rank's message is news (a stall's "has not advanced for 40 s")
        ([_rank(0, "stalled", message="a")], [_rank(0, "stalled", message="b")], None, []),
    ],
)
def test_ranks_delta(
    prev: list[dict[str, Any]],
    new: list[dict[str, Any]],
    changed: list[dict[str, Any]] | None,
    removed: list[int],
) -> None:
    assert ranks_delta(prev, new) == (new if changed is None else changed, removed)


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_page_merges_a_delta_into_its_table(tmp_path: Path) -> None:
    module = tmp_path / "util.mjs"  # the page's own file, as an ES module for node
    module.write_text((STATIC_DIR / "util.js").read_text())
    script = (
        f"import {{ mergeRanks }} from {json.dumps(module.as_uri())};\n"
        "const table = [0, 1, 2, 3].map((rank) => ({ rank, state: 'alive' }));\n"
        "const out = mergeRanks(table, [{ rank: 2, state: 'lost' }, { rank: 5, state: 'alive' }],"
        " [1]);\n"
        "console.log(JSON.stringify(out));\n"
    )
    assert NODE is not None
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"rank": 0, "state": "alive"},
        {"rank": 2, "state": "lost"},
        {"rank": 3, "state": "alive"},
        {"rank": 5, "state": "alive"},
    ]


def _ranks_until_marker(stream: Any) -> list[dict[str, Any]]:
    """The ``ranks`` messages on the stream before the marker message arrives."""
    seen = []
    for kind, data in stream:
        if kind != "feed":
            continue
        for message in json.loads(data):
            if message["type"] == "marker":
                return seen
            if message["type"] == "ranks":
                seen.append(message)
    raise AssertionError("the stream ended before the marker")


def test_a_run_that_is_over_costs_its_page_nothing(aggregator: Any, recs: Records) -> None:
    world = 8
    aggregator.add([recs.step("a", rank, 1, world, loss=1.0) for rank in range(world)])
    with (
        serve(create_app(AggregatorProvider(aggregator))) as base,
        httpx.Client(base_url=base, timeout=READ_TIMEOUT_S) as http,
        http.stream("GET", "/api/stream", params={"run": "a"}) as res,
        # a page that reads its table a page at a time: told how many ranks changed, no table
        http.stream("GET", "/api/stream", params={"run": "a", "ranks": "changes"}) as paged,
    ):
        stream = events(res.iter_lines())
        counts = events(paged.iter_lines())
        assert next(stream)[0] == "hello" and next(counts)[0] == "hello"
        now = time.time() + 60.0  # a minute without a record: every rank is lost
        aggregator.tick(now)
        aggregator.feed.publish({"type": "marker"})
        (first,) = _ranks_until_marker(stream)
        assert "delta" not in first  # the first table of a stream goes whole
        assert [(r["rank"], r["state"]) for r in first["ranks"]] == [(r, "lost") for r in range(8)]
        assert _ranks_until_marker(counts) == [{"type": "ranks", "run": "a", "changed": 8}]

        for later in (3.0, 6.0, 9.0):  # past the re-send period each time; the messages change
            aggregator.tick(now + later)
        aggregator.feed.publish({"type": "marker"})
        assert _ranks_until_marker(stream) == []
        assert _ranks_until_marker(counts) == []

        aggregator.add([recs.step("a", 3, 2, world, t=now + 10.0, loss=2.0)], now=now + 10.0)
        aggregator.tick(now + 10.5)
        aggregator.feed.publish({"type": "marker"})
        (delta,) = _ranks_until_marker(stream)
        assert delta["delta"] is True
        assert [(r["rank"], r["state"], r["last_step"]) for r in delta["ranks"]] == [
            (3, "alive", 2)
        ]
        assert _ranks_until_marker(counts) == [{"type": "ranks", "run": "a", "changed": 1}]
