"""The first announcement of an incident waits for its evidence to settle: changes in, pass by
pass (``now`` passed in), the announcements out."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rankwatch.aggregator.hold import AnnounceHold
from rankwatch.aggregator.incidents.model import Incident, IncidentChange

BASE = Incident(
    id="job#1", run="job", cause="hang", culprits=(5,), affected=(), terminated=(), timeline=(),
    opened=0.0, updated=0.0, resolved=None, state="firing", summary="", basis="",
)  # fmt: skip


def change(kind: str, culprit: int = 5, key: str = "job#1", cause: str = "hang") -> IncidentChange:
    return IncidentChange(kind, replace(BASE, id=key, culprits=(culprit,), cause=cause))


def told(hold: AnnounceHold, passes: dict[float, list[IncidentChange]], until: float) -> list:
    """(now, change, culprit) of every announcement, a pass every 0.2 s up to ``until``."""
    out = []
    for i in range(round(until / 0.2) + 1):
        now = round(0.2 * i, 6)
        for c in hold.due(now, passes.get(now, [])):
            out.append((now, c.change, c.incident.culprits[0]))
    return out


@pytest.mark.parametrize(
    ("passes", "expected"),
    [
        # settled: told quiet_s after it opened
        ({0.2: [change("opened")]}, [(1.2, "opened", 5)]),
        # the culprit's evidence a pass late: one message, naming it, quiet_s after the change
        ({0.2: [change("opened", 7)], 0.6: [change("updated", 5)]}, [(1.6, "opened", 5)]),
        # a judgement that keeps changing is told at the longest hold, as it stands
        (
            {0.2: [change("opened", 7)], 0.6: [change("updated", 5)], 1.2: [change("updated", 6)]},
            [(1.8, "opened", 6)],
        ),
        # once told, an update goes out at once
        (
            {0.2: [change("opened")], 2.0: [change("updated", 6)]},
            [(1.2, "opened", 5), (2.0, "updated", 6)],
        ),
        # resolved while held: told opened, then resolved, at once
        (
            {0.2: [change("opened")], 0.4: [change("resolved")]},
            [(0.4, "opened", 5), (0.4, "resolved", 5)],
        ),
        # its commands settled while held: told opened, then how they ended, never the reverse
        (
            {0.2: [change("opened")], 0.6: [change("acted")]},
            [(0.6, "opened", 5), (0.6, "acted", 5)],
        ),
        # two incidents wait apart
        (
            {0.2: [change("opened")], 0.8: [change("opened", 9, key="job#2", cause="crash")]},
            [(1.2, "opened", 5), (1.8, "opened", 9)],
        ),
    ],
)
def test_an_opening_is_told_once_it_settled(
    passes: dict[float, list[IncidentChange]], expected: list
) -> None:
    assert told(AnnounceHold(quiet_s=1.0, max_s=1.6), passes, 3.0) == expected


def test_no_hold_tells_at_once_and_flush_tells_what_is_held() -> None:
    assert told(AnnounceHold(0, 0), {0.2: [change("opened")]}, 1.0) == [(0.2, "opened", 5)]
    hold = AnnounceHold(1.0, 2.0)
    assert hold.due(0.0, [change("opened", 7)]) == [] and len(hold) == 1
    assert hold.due(0.2, [change("updated", 5)]) == [] and hold.folded == 1
    (opened,) = hold.flush()
    assert (opened.change, opened.incident.culprits, len(hold)) == ("opened", (5,), 0)


def test_bad_holds_are_refused_with_their_name() -> None:
    with pytest.raises(ValueError, match="max_s"):
        AnnounceHold(1.0, -1.0)
