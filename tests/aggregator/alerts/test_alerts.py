"""Alert rules: transitions only, deduplicated, grouped, explained."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from rankwatch.aggregator.alerts.config import AlertConfig, ThresholdRule
from rankwatch.aggregator.alerts.rules import AlertEngine
from rankwatch.aggregator.alerts.sinks.words import alert_dict, alert_line
from rankwatch.aggregator.divergence.detector import (
    Divergence,
    DivergenceDetector,
    QuietSteps,
    StepResult,
    StepStats,
)
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.merge import StepValues


def stats(
    step: int, median: float, metric: str = "loss", lo: float | None = None, hi: float | None = None
) -> StepResult:
    lo = median if lo is None else lo
    hi = median if hi is None else hi
    s = StepStats("r", metric, step, 4, median, 0.0, median, lo, hi, lo, lo, hi, hi)
    return StepResult(s, {}, [], [])


def rh(
    rank: int, state: RankState, last_step: int = 100, since: float = 0.0, message: str = ""
) -> RankHealth:
    return RankHealth("r", rank, state, "node1", 1, 4, last_step, 0.0, 0.0, message, 0, 1.0, since)


def healthy(n: int = 4, **over: RankHealth) -> dict[str, dict[int, RankHealth]]:
    ranks = {r: rh(r, RankState.ALIVE) for r in range(n)}
    ranks.update({int(k[1:]): v for k, v in over.items()})
    return {"r": ranks}


def engine(**kw: Any) -> AlertEngine:
    return AlertEngine(AlertConfig(**kw))


# --- divergence and non-finite -----------------------------------------------------------------

BASE = {r: 1.0 + 0.01 * ((r + 2) % 3) for r in range(16)}


def sv(step: int, values: dict[int, float]) -> StepValues:
    return StepValues("r", "loss", step, values, len(values), True)


def test_divergence_fires_once_and_resolves() -> None:
    det, eng = DivergenceDetector(), engine()
    out = []
    for step in range(1, 6):
        out += eng.evaluate(float(step), results=[det.update(sv(step, {**BASE, 5: 3.0}))])
    (a,) = out
    assert (a.rule, a.state, a.rank, a.metric, a.severity) == (
        "divergence",
        "firing",
        5,
        "loss",
        "warning",
    )
    assert a.since_step == 1 and a.value == 3.0 and a.time == 2.0
    assert a.message.startswith("rank 5 loss 2.97x the median of 16 ranks")
    assert eng.firing() == [a]
    out = []
    for step in range(6, 12):
        out += eng.evaluate(float(step), results=[det.update(sv(step, BASE))])
    (r,) = out
    assert (r.state, r.key, r.time) == ("resolved", a.key, 10.0)
    assert r.message.startswith("resolved: rank 5 loss")
    assert eng.firing() == []
    assert [x.state for x in eng.history()] == ["resolved", "firing"]


def test_nonfinite_is_its_own_critical_rule() -> None:
    det, eng = DivergenceDetector(), engine()
    (a,) = eng.evaluate(1.0, results=[det.update(sv(1, {**BASE, 3: math.nan}))])
    assert (a.rule, a.severity, a.rank) == ("nonfinite", "critical", 3)
    assert "is NaN at step 1" in a.message


def test_many_ranks_are_grouped_into_one_run_alert() -> None:
    det, eng = DivergenceDetector(), engine(group_ranks=8)
    nan_all = {r: math.nan for r in range(64)}
    (a,) = eng.evaluate(1.0, results=[det.update(sv(1, nan_all))])
    assert a.rank is None and a.ranks == tuple(range(64)) and a.key == "nonfinite|r|*|loss"
    assert a.message.startswith("64 ranks: rank 0 loss is NaN") and "and 59 more" in a.message
    assert alert_line(alert_dict(a)).startswith("FIRING [critical] run r, loss: 64 ranks: rank 0")
    assert alert_dict(a)["ranks"] == list(range(64))
    out = []
    for step in range(2, 8):
        out += eng.evaluate(
            float(step), results=[det.update(sv(step, dict.fromkeys(range(64), 1.0)))]
        )
    assert [(x.state, x.key) for x in out] == [("resolved", a.key)]


# --- thresholds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "series", "fires_at", "resolves_at"),
    [
        (ThresholdRule("loss", ">", 5.0), [1, 6, 6, 1], 2, 4),
        (ThresholdRule("loss", ">=", 5.0), [5, 1], 1, 2),
        (ThresholdRule("loss", "<", 0.1), [1, 0.05, 0.2], 2, 3),
        (ThresholdRule("loss", "<=", 0.1), [0.2, 0.3], None, None),
        (ThresholdRule("loss", ">", 5.0, steps=3), [6, 6, 1, 6, 6, 6, 1], 6, 7),
    ],
)
def test_threshold_table(
    rule: ThresholdRule, series: list[float], fires_at: int | None, resolves_at: int | None
) -> None:
    eng = engine(thresholds=(rule,))
    events = []
    for step, value in enumerate(series, start=1):
        events += [(a.state, step) for a in eng.evaluate(float(step), results=[stats(step, value)])]
    expected = [] if fires_at is None else [("firing", fires_at), ("resolved", resolves_at)]
    assert events == expected


def test_threshold_on_any_rank_uses_the_extreme() -> None:
    eng = engine(
        thresholds=(ThresholdRule("grad_norm", ">", 100.0, on="any", severity="critical"),)
    )
    (a,) = eng.evaluate(1.0, results=[stats(1, 5.0, "grad_norm", lo=1.0, hi=250.0)])
    assert a.severity == "critical" and a.value == 250.0
    assert a.message == "grad_norm max across 4 ranks is 250, > 100 (step 1)"


# --- plateau and throughput drop -----------------------------------------------------------------


def test_plateau_fires_after_steps_without_improvement_and_resolves_on_progress() -> None:
    eng = AlertEngine(AlertConfig.from_dict({"plateau": {"steps": 20, "smoothing": 1.0}}))
    fired = []
    for step in range(1, 60):
        loss = max(1.0, 3.0 - 0.1 * step) if step < 50 else 0.5
        fired += [
            (a.rule, a.state, step) for a in eng.evaluate(float(step), results=[stats(step, loss)])
        ]
    # Loss reaches 1.0 at step 20 and stays: the plateau fires 20 steps later, resolves at 50.
    assert fired == [("plateau", "firing", 40), ("plateau", "resolved", 50)]


def test_throughput_drop_against_the_runs_own_baseline() -> None:
    eng = engine()
    events = []
    series = [100.0] * 20 + [40.0] * 5 + [95.0] * 3
    for step, tp in enumerate(series, start=1):
        events += [
            (a.state, step, a.since_step)
            for a in eng.evaluate(float(step), results=[stats(step, tp, "throughput")])
        ]
    assert events == [("firing", 23, 21), ("resolved", 26, 21)]


def test_throughput_drop_needs_a_baseline_first() -> None:
    eng = engine()
    for step, tp in enumerate([100.0, 100.0, 10.0, 10.0, 10.0, 10.0], start=1):
        assert eng.evaluate(float(step), results=[stats(step, tp, "throughput")]) == []


# --- health ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "rule", "severity"),
    [
        (RankState.STALLED, "stalled", "warning"),
        (RankState.LOST, "lost", "critical"),
        (RankState.CRASHED, "crashed", "critical"),
    ],
)
def test_health_rules(state: RankState, rule: str, severity: str) -> None:
    eng = engine()
    assert eng.evaluate(0.0, health=healthy()) == []
    bad = healthy(r2=rh(2, state, since=5.0, message=f"is {state.value}"))
    (a,) = eng.evaluate(10.0, health=bad)
    assert (a.rule, a.rank, a.severity, a.since_time, a.since_step) == (rule, 2, severity, 5.0, 100)
    assert a.message == f"rank 2 (node1) is {state.value}"
    assert eng.evaluate(11.0, health=bad) == []  # deduplicated
    (r,) = eng.evaluate(12.0, health=healthy())
    assert (r.state, r.key) == ("resolved", a.key)


@pytest.mark.parametrize(
    ("state",), [(RankState.PAUSED,), (RankState.FINISHED,), (RankState.ALIVE,)]
)
def test_harmless_states_do_not_alert(state: RankState) -> None:
    assert engine().evaluate(0.0, health=healthy(r1=rh(1, state))) == []


def test_a_finished_run_resolves_everything() -> None:
    det, eng = DivergenceDetector(), engine()
    eng.evaluate(1.0, results=[det.update(sv(1, {**BASE, 3: math.inf}))], health=healthy())
    assert len(eng.firing()) == 1
    done = {"r": {r: rh(r, RankState.FINISHED) for r in range(4)}}
    (r,) = eng.evaluate(2.0, health=done)
    assert r.state == "resolved" and eng.firing() == []
    # A step rule firing in the call that learns the run finished: nothing fires either.
    over = [stats(s, 5.0) for s in range(3, 9)]
    eng = engine(thresholds=(ThresholdRule("loss", ">", 1.0),))
    assert eng.evaluate(3.0, results=over, health=done) == [] and eng.firing() == []


def test_straggler_from_the_ranks_last_steps() -> None:
    eng = engine()
    slow = healthy(r3=rh(3, RankState.ALIVE, last_step=40))
    (a,) = eng.evaluate(1.0, health=slow)
    assert (a.rule, a.rank, a.since_step) == ("straggler", 3, 40)
    assert "60 steps behind the median step 100" in a.message
    assert eng.evaluate(2.0, health=slow) == []
    (r,) = eng.evaluate(3.0, health=healthy())
    assert r.state == "resolved"


def test_disabled_rules_and_severity_overrides() -> None:
    eng = AlertEngine(
        AlertConfig.from_dict({"disabled": ["stalled"], "severity": {"lost": "warning"}})
    )
    assert eng.evaluate(0.0, health=healthy(r1=rh(1, RankState.STALLED))) == []
    (a,) = eng.evaluate(1.0, health=healthy(r1=rh(1, RankState.LOST)))
    assert a.severity == "warning"


def test_lost_ranks_of_a_whole_run_group_and_ungroup() -> None:
    eng = engine(group_ranks=2)
    (a,) = eng.evaluate(0.0, health={"r": {r: rh(r, RankState.LOST) for r in range(4)}})
    assert a.rank is None and a.ranks == (0, 1, 2, 3)
    partly = {"r": {r: rh(r, RankState.LOST if r == 0 else RankState.ALIVE) for r in range(4)}}
    out = eng.evaluate(1.0, health=partly)
    assert sorted((x.state, x.rank) for x in out) == [("firing", 0), ("resolved", None)]


# --- the alert as a value ------------------------------------------------------------------------


def test_history_is_newest_first_and_bounded() -> None:
    eng = engine(history_size=3, thresholds=(ThresholdRule("loss", ">", 1.0),))
    for step in range(1, 9):
        eng.evaluate(float(step), results=[stats(step, 2.0 if step % 2 else 0.5)])
    hist = eng.history()
    assert len(hist) == 3 and [a.time for a in hist] == [8.0, 7.0, 6.0]
    assert len(eng.history(limit=1)) == 1


# --- many steps per call ---------------------------------------------------------------------


def quiet(metric: str, rows: list[tuple[int, float, float, float]]) -> QuietSteps:
    """Quiet steps as the batch scorer hands them over: (step, median, min, max) each."""
    stats = [(med, 0.0, med, lo, hi, lo, lo, hi, hi) for _, med, lo, hi in rows]
    cols = [np.array(c, dtype=np.float64) for c in zip(*stats, strict=True)] or [np.zeros(0)] * 9
    n = len(rows)
    steps = [step for step, *_ in rows]
    return QuietSteps("r", metric, [0, 1, 2, 3], np.zeros((n, 4)), cols, steps, range(n), [1.0] * n)


@pytest.mark.parametrize("seed", range(40))
def test_step_rules_over_many_steps_per_call_match_one_step_per_call(seed: int) -> None:
    """The step rules build a firing condition's words once per call (from its last step):
    what is firing after each call, since when and with which words, is what calling once
    per step gives."""
    rng = random.Random(seed)
    cfg = AlertConfig.from_dict({
        "plateau": {"steps": rng.choice([3, 8]), "smoothing": rng.choice([0.3, 1.0])},
        "thresholds": [
            {"metric": "loss", "op": ">", "value": 2.5, "steps": rng.choice([1, 3])},
            {"metric": "throughput", "op": "<", "value": 50.0, "on": "any"},
        ],
    })  # fmt: skip
    per_step, batched = AlertEngine(cfg), AlertEngine(cfg)
    loss, tp, step = 3.0, 100.0, 0
    for call in range(60):
        now = float(call)
        rows: dict[str, list[tuple[int, float, float, float]]] = {"loss": [], "throughput": []}
        for _ in range(rng.choice([1, 2, 5, 17])):
            step += rng.choice([1, 1, 1, 3])
            loss = loss * rng.choice([0.97, 1.0, 1.0, 1.0, 1.08]) + rng.gauss(0, 0.005)
            tp = rng.choice([tp, tp, tp, 100.0, 30.0, 45.0])
            rows["loss"].append((step, loss, loss * 0.9, loss * 1.1))
            rows["throughput"].append((step, tp, tp * 0.8, tp))
        for metric, metric_rows in rows.items():
            for s, med, lo, hi in metric_rows:
                st = StepStats("r", metric, s, 4, med, 0.0, med, lo, hi, lo, lo, hi, hi)
                per_step.evaluate(now, results=[StepResult(st, {}, [], [])])
        batched.evaluate(now, results=[quiet(m, r) for m, r in rows.items()])
        # (``time``, when an alert was first published, is the caller's grouping: one call
        # never publishes a condition that cleared and fired again within it as resolved)
        a, b = ([replace(x, time=0.0) for x in e.firing()] for e in (batched, per_step))
        assert a == b, f"seed {seed}, call {call}"
    assert {a.rule for a in per_step.history(1000)} >= {"plateau", "threshold"}


# --- a big run: the ranks that changed, one grouped condition ----------------------------------


def big_run(n: int, lost: set[int], message: str = "no record for 12 s") -> dict:
    return {"r": {r: rh(r, RankState.LOST if r in lost else RankState.ALIVE, since=float(r),
                        message=message) for r in range(n)}}  # fmt: skip


def test_a_big_run_is_looked_at_again_only_in_the_ranks_that_changed() -> None:
    from rankwatch.aggregator.alerts.rules import FULL_PASS_RANKS

    n = FULL_PASS_RANKS + 904
    eng = engine()
    lost = set(range(2000))
    (a,) = eng.evaluate(0.0, health=big_run(n, lost), health_changed={("r", r) for r in lost})
    assert a.rule == "lost" and a.rank is None and a.ranks == tuple(range(2000))
    assert a.message.startswith("2,000 ranks lost (ranks 0-1999): rank 0 (node1) no record")
    # every rank's words changed, none of their states: nothing to look at, nothing published
    assert eng.evaluate(1.0, health=big_run(n, lost, "later"), health_changed=set()) == []
    assert eng.firing()[0].message == a.message
    # one rank back, one more lost: the grouped alert names them, since its first rank's time
    lost2 = (lost - {5}) | {3000}
    changed = {("r", 5), ("r", 3000)}
    assert eng.evaluate(2.0, health=big_run(n, lost2), health_changed=changed) == []
    (now,) = eng.firing()
    assert now.ranks == (*range(5), *range(6, 2000), 3000) and now.since_time == 0.0
    assert "(ranks 0-4, 6-1999, 3000)" in now.message
    (r,) = eng.evaluate(
        3.0, health=big_run(n, set()), health_changed=changed | {("r", x) for x in lost}
    )
    assert r.state == "resolved" and eng.firing() == []


@pytest.mark.parametrize("seed", range(3))
def test_a_big_run_given_its_changes_alerts_as_a_pass_over_every_rank(seed: int) -> None:
    from rankwatch.aggregator.alerts.rules import FULL_PASS_RANKS

    rng = random.Random(seed)
    n = FULL_PASS_RANKS + 100
    states = [RankState.ALIVE, RankState.LOST, RankState.STALLED, RankState.CRASHED]
    now_state = dict.fromkeys(range(n), RankState.ALIVE)
    group = rng.choice([8, 5000])  # grouped, or one alert per rank
    full, told = engine(group_ranks=group), engine(group_ranks=group)
    for call in range(8):
        changed = set(rng.sample(range(n), rng.choice([0, 1, 7, 300])))
        if call == 0:
            changed = set(range(n))
        for r in changed:
            now_state[r] = rng.choice(states)
        health = {"r": {r: rh(r, s, since=float(call)) for r, s in now_state.items()}}
        a = full.evaluate(float(call), health=health)
        b = told.evaluate(float(call), health=health, health_changed={("r", r) for r in changed})
        assert sorted((x.key, x.state, x.ranks) for x in a) == sorted(
            (x.key, x.state, x.ranks) for x in b
        )
        assert [(x.key, x.ranks, x.since_time) for x in full.firing()] == [
            (x.key, x.ranks, x.since_time) for x in told.firing()
        ]


def test_rank_ranges_name_the_first_ranges_and_say_there_are_more() -> None:
    from rankwatch.aggregator.alerts.conds import rank_ranges

    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert rank_ranges([0, 2, 4, 6], limit=2) == "0, 2, ..."
    assert rank_ranges([]) == ""


@pytest.mark.parametrize("seed", range(3))
def test_a_steps_divergences_set_at_once_are_the_conditions_set_one_by_one(seed: int) -> None:
    # _divergences puts a group's conditions at once (a cascade's step is every rank's); the
    # conditions, the grouped alerts and their transitions are those of _set one by one
    rng = random.Random(seed)
    batched, single = engine(), engine()

    def one_by_one(res: StepResult, now: float) -> None:
        for d in res.new:
            rule = "nonfinite" if d.kind == "nonfinite" else "divergence"
            single._set(single._from_divergence(rule, d, now))
        for d in res.resolved:
            single._clear("nonfinite" if d.kind == "nonfinite" else "divergence",
                          d.run, d.rank, d.metric)  # fmt: skip

    single._divergences = one_by_one  # type: ignore[method-assign]
    det = DivergenceDetector()
    for step in range(1, 40):
        for metric in ("loss", "grad_norm"):
            values = {r: 1.0 + 0.01 * rng.gauss(0, 1) for r in range(300)}
            bad = rng.sample(range(300), rng.choice([0, 2, 150, 290]))
            for r in bad:
                values[r] = math.nan if rng.random() < 0.7 else 4.0
            res = det.update(StepValues("r", metric, step, values, 300, True))
            now = 1000.0 + step
            got = batched.evaluate(now, results=[res])
            want = single.evaluate(now, results=[res])
            assert got == want
        assert list(batched._conds.values()) == list(single._conds.values())
    assert batched.firing() == single.firing() and batched.firing()


def test_two_divergences_of_one_rank_in_one_step_are_one_condition_since_the_first() -> None:
    # an outlier and an offset of the same rank and metric flagged at one step: one condition
    # (rule "divergence"), dated as the first one set, as _set one by one dates it
    s = stats(12, 1.0).stats

    def div(kind: str, since: int) -> Any:
        return Divergence("r", "loss", 3, kind, "high", since, 12, 2.0, 1.0, 6.0, 2.0, kind, 16)

    res = StepResult(s, {}, [div("outlier", 10), div("offset", 5)], [])
    eng = engine()
    (alert,) = eng.evaluate(1000.0, results=[res])
    assert (alert.rule, alert.rank, alert.since_step) == ("divergence", 3, 10)
    assert len(eng._conds) == 1
