"""The dry run (pure) and `rankwatch policy test` over a real stored run."""

from __future__ import annotations

from pathlib import Path

from rankwatch.aggregator.actions.dryrun import dry_run
from rankwatch.aggregator.actions.policy import parse_spec
from rankwatch.aggregator.service import Aggregator, ServeConfig

from tests.aggregator.test_service_incidents import RUN, feed_nan_spread
from tests.cli.running import cli

NAN = {"id": "r#1", "run": "r", "cause": "nonfinite", "step": 20, "state": "resolved",
       "culprits": [2], "opened": 20.0, "resolved": 60.0, "summary": "rank 2 went NaN"}  # fmt: skip
STEPS = [(float(s), s) for s in range(1, 101)]  # a step a second, to step 100


def test_a_stop_on_nan_would_have_saved_the_rest_of_the_run() -> None:
    (w,) = dry_run(parse_spec("stop-on-nan"), [NAN], STEPS, 1.0)
    assert (w.at_step, w.act_step, w.last_step, w.saved) == (20, 22, 100, 78)
    assert "checkpoint, then stop every rank at the end of step 22" in w.line()
    assert "78 steps before the run's last step 100" in w.line()


def test_after_steps_fires_only_while_the_incident_lasts() -> None:
    div = {**NAN, "cause": "divergence"}
    (w,) = dry_run(parse_spec("divergence@30:stop"), [div], STEPS, 1.0)
    assert w.time == 50.0 and w.at_step == 50 and w.saved == 48
    assert dry_run(parse_spec("divergence@50:stop"), [div], STEPS, 1.0) == []  # resolved first
    (w,) = dry_run(parse_spec("divergence@50:notify"), [{**div, "resolved": None}], STEPS, 1.0)
    assert w.saved == 0 and w.line().count("notify") == 1
    assert dry_run(parse_spec("crash:stop"), [NAN], STEPS, 1.0) == []


def test_policy_test_cli_on_a_stored_run(tmp_path: Path) -> None:
    agg = Aggregator(ServeConfig(data_dir=tmp_path / "data", console_alerts=False))
    feed_nan_spread(agg, fault=20, steps=40)
    agg.stop()
    out = cli("policy", "test", "--run", RUN, "--data", str(tmp_path / "data"), "--policy",
              "stop-on-nan")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "policy nonfinite: on a nonfinite incident: checkpoint, then stop" in out.stdout
    assert "would checkpoint, then stop every rank at the end of step" in out.stdout
    assert "steps before the run's last step 40" in out.stdout
    bad = cli("policy", "test", "--run", "nope", "--data", str(tmp_path / "data"), "--policy",
              "stop-on-nan")  # fmt: skip
    assert bad.returncode == 1 and "no stored run 'nope'" in bad.stderr
    none = cli("policy", "test", "--run", RUN, "--data", str(tmp_path / "data"))
    assert none.returncode == 2 and "no policy given" in none.stderr
