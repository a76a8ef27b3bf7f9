"""Which alerts an incident stands for (webhooks leave those to the incident's messages)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.incidents import cover as cover_module
from rankwatch.aggregator.incidents.cover import AlertCover
from rankwatch.aggregator.incidents.model import Incident

from tests.aggregator.incidents.builders import RUN, T0


def incident(culprits: tuple[int, ...], affected: tuple[int, ...] = (), state: str = "firing",
             run: str = RUN) -> Incident:  # fmt: skip
    return Incident(f"{run}#1", run, "nonfinite", culprits, affected, (), (), T0, T0, None, state,
                    "rank 2 went non-finite first", "non-finite first", 20)  # fmt: skip


def alert(rule: str, rank: int | None, state: str = "firing", ranks: tuple[int, ...] = (),
          run: str = RUN) -> Alert:  # fmt: skip
    return Alert(f"{rule}|{run}|{rank}|loss", rule, "critical", state, run, rank, "loss", 20, T0,
                 T0, None, f"{rule} on rank {rank}", ranks)  # fmt: skip


OPEN = [(RUN, [incident((2,), (0, 1, 3))])]


@pytest.mark.parametrize(
    ("item", "incidents", "covered"),
    [
        (alert("nonfinite", 2), OPEN, True),  # the culprit's own alert
        (alert("crashed", 1), OPEN, True),  # an affected rank's
        (alert("lost", None, ranks=(0, 1, 3)), OPEN, True),  # a grouped alert, all in it
        (alert("lost", None, ranks=(0, 1, 7)), OPEN, False),  # rank 7 is in no incident
        (alert("stalled", 7), OPEN, False),
        (alert("threshold", None), OPEN, False),  # run-level: no incident explains a median
        (alert("plateau", None), OPEN, False),
        (alert("nonfinite", 2, run="other"), OPEN, False),  # another run's incident
        (alert("nonfinite", 2), [(RUN, [incident((2,), state="resolved")])], False),
        (alert("nonfinite", 2), [], False),
    ],
)
def test_which_alerts_an_incident_stands_for(item: Alert, incidents: list, covered: bool) -> None:
    assert AlertCover().judge([item], incidents) == [covered]


def test_a_resolution_goes_where_its_firing_went() -> None:
    cover = AlertCover()
    early = alert("divergence", 2)  # announced before any incident held rank 2
    assert cover.judge([early], []) == [False]
    held = alert("nonfinite", 2)
    assert cover.judge([held], OPEN) == [True]
    resolved = [replace(early, state="resolved"), replace(held, state="resolved")]
    assert cover.judge(resolved, OPEN) == [False, True]
    assert cover.judge([replace(held, state="resolved")], OPEN) == [False]  # once
    assert cover.covered == 2


def test_the_alerts_held_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cover_module, "HELD_MAX", 8)
    cover = AlertCover()
    many = [replace(alert("nonfinite", 2), key=f"k{i}") for i in range(8 + 3)]
    assert all(cover.judge(many, OPEN))
    assert cover.forgotten == 3
    # the oldest was forgotten: its resolution is sent rather than lost
    assert cover.judge([replace(many[0], state="resolved")], OPEN) == [False]
    assert cover.judge([replace(many[-1], state="resolved")], OPEN) == [True]
