"""The console sink: one line per alert transition."""

from __future__ import annotations

import io

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.alerts.sinks.base import Sink
from rankwatch.aggregator.alerts.sinks.console import ConsoleSink, format_alert
from rankwatch.aggregator.incidents.tracker import IncidentTracker

from tests.aggregator.incidents.builders import T0, nan
from tests.aggregator.incidents.scenario import deliver, world

NOW = 1_700_000_100.0


def test_console_sink_prints_one_line_per_transition() -> None:
    alert = Alert(
        key="divergence|r|2|loss", rule="divergence", severity="warning", state="firing", run="r",
        rank=2, metric="loss", since_step=21, since_time=NOW, time=NOW, value=float("nan"),
        message="rank 2 loss 3.1x the median of 4 ranks (z=8.2) since step 21",
    )  # fmt: skip
    out = io.StringIO()
    sink = ConsoleSink(out)
    sink(alert)
    line = out.getvalue()
    assert line.count("\n") == 1
    assert "FIRING [warning] run r, rank 2, loss: rank 2 loss 3.1x" in line
    assert "(since step 21)" not in line  # the message already says since when
    assert format_alert(alert).split(" rankwatch ")[1] == line.strip().split(" rankwatch ")[1]
    assert isinstance(sink, Sink) and sink.snapshot() == {"printed": 1, "failed": 0}


def test_a_closed_stream_is_counted_not_raised() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out)
    out.close()
    sink.submit({"rule": "lost", "severity": "critical", "run": "r", "rank": 1})
    assert sink.snapshot() == {"printed": 0, "failed": 1}
    sink.close()


def test_an_incident_is_one_line_with_the_dashboard_link_when_the_address_is_known() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    (opened,) = t.observe(T0 + 100, divergences=[nan(2, 20)])
    out = io.StringIO()
    ConsoleSink(out, public_url="https://rw.example.org").submit_incident(opened)
    line = out.getvalue()
    assert line.count("\n") == 1
    assert line.endswith(
        "rankwatch [INCIDENT] job: rank 2 non-finite: rank 2 (node-0, pid 1002) went non-finite "
        "first (loss at step 20) | no action taken: checkpoint or stop it with the buttons on "
        "the dashboard's incident card (serve --token) "
        "https://rw.example.org/#run=job&sel=2&zoom=0-40\n"
    )
