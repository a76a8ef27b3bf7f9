"""Which open incidents the store gets again: those that grew without an announced change."""

from __future__ import annotations

from dataclasses import replace

from rankwatch.aggregator.incidents.keep import StoreDue
from rankwatch.aggregator.incidents.model import Incident

from tests.aggregator.incidents.builders import RUN, T0

OPENED = Incident(f"{RUN}#1", RUN, "crash", (1,), (), (), (), T0, T0, None, "firing",
                  "rank 1 crashed first", "crashed first", 6)  # fmt: skip


def test_an_incident_is_stored_again_when_it_grows_and_not_otherwise() -> None:
    due = StoreDue()
    due.stored(OPENED)  # announced: the service stored it
    assert due.due([OPENED]) == []
    grown = replace(OPENED, terminated=(0, 2), summary="rank 1 crashed first; 2 ranks terminated")
    assert due.due([grown]) == [grown]
    assert due.due([replace(grown, updated=T0 + 5)]) == []  # judged again, nothing new
    done = replace(grown, state="resolved")
    due.stored(done)
    assert due.due([done]) == []  # resolved ones are stored when announced, not here
