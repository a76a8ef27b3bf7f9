"""The words sinks and ``rankwatch status`` show for an incident."""

from __future__ import annotations

from dataclasses import replace

from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.incidents.tracker import IncidentTracker
from rankwatch.aggregator.incidents.words import dashboard_link, status_lines, text, title

from tests.aggregator.incidents.builders import RUN, T0, crashed, health, nan
from tests.aggregator.incidents.scenario import deliver, world


def test_opened_updated_resolved_words() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    (opened,) = t.observe(T0 + 100, divergences=[nan(r, 21) for r in (0, 1, 3)])
    assert title(opened) == "[INCIDENT] job: ranks 0, 1, 3 non-finite"
    (updated,) = t.observe(T0 + 101, divergences=[nan(2, 20)])
    assert title(updated) == "[UPDATED] job: rank 2 non-finite"
    words = text(updated, "https://rw.example.org/")
    assert words.splitlines() == [
        "rank 2 (node-0, pid 1002) went non-finite first (loss at step 20); 3 ranks (0, 1, 3)"
        " followed from step 21.",
        "fault step 20; 3 ranks affected after it",
        "was: ranks 0, 1, 3 non-finite (non-finite first, at step 21 (loss)); "
        "now: non-finite first, at step 20 (loss)",
        "job#1, opened 2023-11-14 22:15:00 UTC",
        "https://rw.example.org/#run=job&sel=2&zoom=0-40",
    ]
    t.observe(T0 + 150, resolved=[nan(r, 30) for r in range(4)])
    (done,) = t.incidents(RUN)
    assert done.state == "resolved" and "resolved 2023-11-14 22:15:50 UTC" in text(
        type(updated)("resolved", done)
    )


def test_link_quotes_the_run_name() -> None:
    t = IncidentTracker()
    deliver(t, world(2, run="a b&c"), now=T0)
    (c,) = t.observe(T0 + 1, health=[replace(crashed(1, "ValueError: x"), run="a b&c")])
    link = dashboard_link("http://h:8670", c.incident)
    assert link == "http://h:8670/#run=a%20b%26c&sel=1&zoom=0-40"


def test_status_lines_open_first() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, health=[health(3, RankState.LOST, since=T0 + 12)])
    t.observe(T0 + 130, health=[health(3)])
    t.observe(T0 + 140, health=[crashed(1, "ValueError: bad shard", since=T0 + 140)])
    t.observe(T0 + 141, health=[crashed(r, "RuntimeError: gloo timed out", since=T0 + 141)
                                for r in (0, 2)])  # fmt: skip
    lines = status_lines(t.incidents(RUN))
    assert lines == [
        "OPEN     job#2: rank 1 (node-0, pid 1001) crashed first (ValueError: bad shard); "
        "2 ranks (0, 2) failed after it",
        "         fault step 20, 2 affected, basis: crashed first, not in a collective",
        "resolved job#1: rank 3 (node-0, pid 1003) went silent first",
        "         fault step 19, basis: went silent first",
    ]
