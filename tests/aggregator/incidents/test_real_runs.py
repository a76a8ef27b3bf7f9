"""Incident rules on what real jobs of this repository's demo produced (msrun, 4 ranks, CPU).

The verdicts below were recorded from a real msrun run of this repository's demo
(``tests/e2e/test_incidents_msrun.py``); the e2e tests run the jobs, these pin the rules on
their evidence without a job.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.incidents.tracker import IncidentTracker

from tests.aggregator.incidents.builders import RUN, T0, crash_text, crashed, health
from tests.aggregator.incidents.scenario import deliver, world

SLOW_STEP = 12


def data_time_outlier(step: int = SLOW_STEP) -> Divergence:
    # `--fault slow --slow-s 0.5` on rank 2: every rank's step_time went from 0.16 s to 0.6 s
    # (they wait for it in the all-reduce); only rank 2's data_time stood out.
    return Divergence(
        RUN, "data_time", 2, "outlier", "high", step, step, 0.501, 0.00065, 51.2, 769.35,
        "rank 2 data_time is 769.35x the median", 4,
    )  # fmt: skip


def divergence_alert(metric: str, state: str = "firing") -> Alert:
    return Alert(
        f"divergence|{RUN}|2|{metric}", "divergence", "warning", state, RUN, 2, metric,
        SLOW_STEP, T0 + 10, T0 + 10, 0.501, f"rank 2 {metric} high",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("metric", "cause"),
    [("data_time", "slow"), ("step_time", "slow"), ("throughput", "slow"), ("loss", "divergence")],
)
def test_an_outlier_in_a_timing_metric_is_slowness(metric: str, cause: str) -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 10, divergences=[replace(data_time_outlier(), metric=metric)])
    t.observe(T0 + 10.5, alerts=[divergence_alert(metric)])
    (inc,) = t.incidents(RUN)
    assert (inc.cause, inc.culprits, inc.affected, inc.step) == (cause, (2,), (), SLOW_STEP)


def test_slow_rank_recovers_when_its_data_time_does() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 10, divergences=[data_time_outlier()], alerts=[divergence_alert("data_time")])
    done = t.observe(T0 + 30, resolved=[data_time_outlier(30)])
    done += t.observe(T0 + 31, alerts=[divergence_alert("data_time", "resolved")])
    assert [(c.change, c.incident.cause) for c in done] == [("resolved", "slow")]


def test_real_hang_peers_failing_in_allreduce_name_the_sleeping_rank() -> None:
    # `--fault hang` at step 12 on rank 2: ranks 0, 1, 3 failed in the gradient all-reduce with
    # this message about 8 s later; msrun then sent rank 2 SIGTERM.
    t = IncidentTracker()
    deliver(t, world(4))
    text = crash_text("msrun_demo_hang_peer_allreduce.txt").removeprefix("crashed: builtins.")
    t.observe(T0 + 8, health=[crashed(r, text, step=11, since=T0 + 8) for r in (0, 1, 3)])
    term = health(2, RankState.FINISHED, step=11, since=T0 + 9, message="finished (SIGTERM)")
    t.observe(T0 + 9, health=[term])
    (inc,) = t.incidents(RUN)
    assert (inc.cause, inc.culprits, inc.affected, inc.step) == ("hang", (2,), (0, 1, 3), 11)


@pytest.mark.parametrize("held", [None, 4])
def test_a_hung_rank_with_stale_health_hangs_after_its_peers_last_step(held: int | None) -> None:
    # As the service feeds it: the health held for rank 2 is that of its last state change,
    # its first sight (no step) or a change long before the fault (step 4 in a torchrun run);
    # ranks 0, 1, 3 then fail in the all-reduce after step 11. Until rank 2's own SIGTERM
    # arrives, the incident (and the message sent when it opens) must say step 11.
    t = IncidentTracker()
    deliver(t, [("health", health(r, step=held if r == 2 else 11)) for r in range(4)])
    text = crash_text("msrun_demo_hang_peer_allreduce.txt").removeprefix("crashed: builtins.")
    changes = t.observe(T0 + 8, health=[crashed(r, text, step=11, since=T0 + 8) for r in (0, 1, 3)])
    (inc,) = t.incidents(RUN)
    assert (inc.cause, inc.culprits, inc.step) == ("hang", (2,), 11)
    assert [c.change for c in changes] == ["opened"]
    assert "hung after step 11" in changes[0].incident.summary, changes[0].incident.summary
