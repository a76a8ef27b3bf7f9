"""The persistent-offset test (divergence/offset.py): a small lasting offset of one rank.

Real traces (tests/fixtures, the demo's msrun job): rank 2's local gradients 1.3x from step 20
are flagged on ``grad_norm_local`` within 20 steps, which the per-step CUSUM alone never does;
the clean run is never flagged. Seeded synthetic worlds cover the rest: no flag on clean noise,
the flag resolving once the offset goes, both scoring paths agreeing, and the settings checked.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rankwatch.aggregator.divergence.config import DEFAULT_RULES, DivergenceConfig, MetricRule
from rankwatch.aggregator.divergence.detector import DivergenceDetector, expand
from rankwatch.aggregator.divergence.offset import KIND, others_medians
from rankwatch.aggregator.merge import StepValues

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CLEAN = "msrun4_grad_norm_local_clean.csv"
SDC = "msrun4_grad_norm_local_rank2_sdc0.3_from_step20.csv"
ONSET, WITHIN, BAD = 20, 20, 2
METRIC = "grad_norm_local"
NOISE = 0.17  # per-step sd of a rank's log ratio in the real job (docs/benchmarks.md)

Trace = dict[int, dict[int, float]]


def load(name: str, column: str = METRIC) -> Trace:
    out: Trace = {}
    with open(FIXTURES / name, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["step"]), {})[int(row["rank"])] = float(row[column])
    return out


def no_offset_test() -> DivergenceConfig:
    return DivergenceConfig(
        rules={m: replace(r, offset_steps=None) for m, r in DEFAULT_RULES.items()}
    )


def flags(trace: Trace, config: DivergenceConfig | None = None, metric: str = METRIC) -> list:
    det = DivergenceDetector(config)
    out = []
    for step in sorted(trace):
        res = det.update(StepValues("run", metric, step, trace[step], len(trace[step]), True))
        out += [(d.step, d.rank, d.kind) for d in res.new]
    return out


def synthetic(steps: int, seed: int, ranks: int = 4, offset: dict[int, float] | None = None,
              until: int | None = None) -> Trace:  # fmt: skip
    """Log-normal per-rank noise of NOISE around a slowly falling norm; ``offset``: rank ->
    factor from step 21 (to ``until``)."""
    rng = random.Random(seed)
    out: Trace = {}
    for step in range(1, steps + 1):
        level = 1.0 / (1 + step / 200)
        row = {r: level * math.exp(rng.gauss(0, NOISE)) for r in range(ranks)}
        for r, factor in (offset or {}).items():
            if step > ONSET and (until is None or step <= until):
                row[r] *= factor
        out[step] = row
    return out


def test_others_medians_is_the_median_of_the_other_values() -> None:
    rng = random.Random(3)
    for n in range(2, 10):
        for _ in range(50):
            values = [
                float(rng.choice([1, 2, 2, 3, 5, 8])) + rng.random() * (n % 2) for _ in range(n)
            ]
            want = [sorted(values[:i] + values[i + 1 :]) for i in range(n)]
            want_med = [(o[(n - 2) // 2] + o[(n - 1) // 2]) / 2 for o in want]
            assert others_medians(np.array(values)).tolist() == want_med, values


def test_real_sdc_trace_is_flagged_on_the_offset_within_20_steps() -> None:
    got = flags(load(SDC))
    assert got, "rank 2's 1.3x local gradients were not flagged"
    step, rank, kind = got[0]
    assert (rank, kind) == (BAD, KIND) and ONSET <= step < ONSET + WITHIN, got
    assert {r for _, r, _ in got} == {BAD}, got


def test_real_sdc_trace_is_not_flagged_without_the_offset_test() -> None:
    # what the offset test adds: the per-step CUSUM alone never sees this fault
    assert flags(load(SDC), no_offset_test()) == []


def test_real_clean_trace_and_the_losses_are_never_flagged() -> None:
    assert flags(load(CLEAN)) == []
    assert flags(load(CLEAN, "loss"), metric="loss") == []
    assert flags(load(SDC, "loss"), metric="loss") == []  # the loss does not show it
    for ranks in itertools.combinations(range(4), 3):  # 3-rank worlds
        trace = {s: {r: row[r] for r in ranks} for s, row in load(CLEAN).items()}
        assert [f for f in flags(trace) if f[2] == KIND] == [], ranks


def test_clean_synthetic_worlds_raise_no_offset_flag() -> None:
    for seed, ranks in itertools.product(range(4), (3, 4, 8, 64)):
        got = [f for f in flags(synthetic(400, seed, ranks)) if f[2] == KIND]
        assert got == [], (seed, ranks, got)


def test_an_offset_that_goes_away_resolves() -> None:
    trace = synthetic(140, 1, offset={BAD: 1.3}, until=60)
    det = DivergenceDetector()
    new, resolved = [], []
    for step in sorted(trace):
        res = det.update(StepValues("run", METRIC, step, trace[step], 4, True))
        new += [(d.step, d.rank, d.kind) for d in res.new]
        resolved += [(d.step, d.rank, d.kind, d.message) for d in res.resolved]
    assert new[0][1:] == (BAD, KIND) and {r for _, r, _ in new} == {BAD}, new
    gone = [r for r in resolved if r[2] == KIND]
    assert len(gone) == 1 and gone[0][1] == BAD, resolved
    assert gone[0][0] > 60 and "back with the others" in gone[0][3], resolved
    assert det.active() == []


def test_a_low_offset_is_flagged_low_and_a_one_sided_rule_ignores_it() -> None:
    trace = synthetic(80, 2, offset={1: 0.75})
    det = DivergenceDetector()
    got = []
    for step in sorted(trace):
        got += det.update(StepValues("run", METRIC, step, trace[step], 4, True)).new
    assert [(d.rank, d.kind, d.direction) for d in got] == [(1, KIND, "low")], got
    assert got[0].rel < 0.95 and "on average over 16 steps" in got[0].message
    high_only = DivergenceConfig(
        rules={**DEFAULT_RULES, METRIC: MetricRule("high", offset_steps=16)}
    )
    assert flags(trace, high_only) == []


def test_update_many_gives_the_same_verdicts_as_update() -> None:
    trace = synthetic(120, 4, ranks=6, offset={5: 1.3})
    one = flags(trace)
    det = DivergenceDetector()
    svs = [StepValues("run", METRIC, s, trace[s], 6, True) for s in sorted(trace)]
    many = [(d.step, d.rank, d.kind) for r in expand(det.update_many(svs)) for d in r.new]
    assert one == many and one, (one, many)


def test_offset_steps_must_be_an_integer_of_at_least_2() -> None:
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError, match="offset_steps must be an integer >= 2"):
            MetricRule(offset_steps=bad)  # type: ignore[arg-type]
    cfg = DivergenceConfig.from_dict({"rules": {"loss": {"offset_steps": 8}}})
    assert cfg.rule("loss").offset_steps == 8 and cfg.rule(METRIC).offset_steps == 16
    assert cfg.rule("train/grad_norm_local").offset_steps == 16


def test_a_flagged_rank_gives_the_others_no_offset() -> None:
    # Rank 2 far above: left in the others' medians it would drag each clean rank's log ratio
    # down for as long as it lasts.
    for seed, factor in itertools.product(range(20), (1.3, 2.0, 10.0)):
        got = [f for f in flags(synthetic(200, seed, 4, offset={BAD: factor})) if f[1] != BAD]
        assert got == [], (seed, factor, got)
