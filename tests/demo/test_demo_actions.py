"""The demo's summary of what its policy did (pure)."""

from __future__ import annotations

from rankwatch.demo.launcher import DemoConfig, actions_summary, serve_command


def command(cmd: str, states: dict[str, tuple[str, int | None]]) -> dict:
    acks = {r: {"state": s, "step": step} for r, (s, step) in states.items()}
    return {"cmd": cmd, "step": 22, "by": "policy:nonfinite", "created": 1.0, "acks": acks}


def test_the_summary_says_how_many_steps_the_stop_saved() -> None:
    done = {"0": ("done", 22), "1": ("done", 22)}
    said = actions_summary([command("stop", done), command("checkpoint", done)], 300, 20)
    assert said["stopped_at"] == 22 and said["saved_steps"] == 278
    assert said["lines"][0].startswith("  action:     checkpoint at step 22")
    assert said["lines"][-1] == ("  saved:      every rank stopped after step 22, 2 after the "
                                 "fault: 278 of 300 steps not trained on a bad run")  # fmt: skip
    split = actions_summary([command("stop", {"0": ("done", 22), "1": ("no_ack", None)})], 300, 20)
    assert split["saved_steps"] == 0 and "did not all stop" in split["lines"][-1]
    assert "no matching incident" in actions_summary([], 300, 20)["lines"][-1]


def test_the_policy_reaches_serve_and_is_checked() -> None:
    cfg = DemoConfig(policy="stop-on-nan")
    assert serve_command(cfg, __import__("pathlib").Path("/nonexistent"))[-2:] == [
        "--policy", "stop-on-nan",
    ]  # fmt: skip
    bad = DemoConfig(policy="explode")
    try:
        bad.check()
    except ValueError as exc:
        assert "expected a preset" in str(exc)
    else:
        raise AssertionError("a bad policy passed the check")
