"""The synthetic loss model of `rankwatch demo --simulate` (pure, table-driven)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from rankwatch.demo.simulate import synthetic_step

RANKS = 4
FAULT_RANK = 2
FAULT_STEP = 20


def losses(fault: str, step: int, seed: int = 0) -> list[float]:
    return [
        synthetic_step(r, step, fault, FAULT_RANK, FAULT_STEP, random.Random(seed * 100 + r))[
            "loss"
        ]
        for r in range(RANKS)
    ]


@pytest.mark.parametrize("fault", ["labels", "nan", "slow", "hang", "crash", "sdc", "none"])
def test_before_the_fault_every_rank_is_healthy(fault: str) -> None:
    for step in (1, 10, FAULT_STEP - 1):
        values = losses(fault, step)
        assert all(math.isfinite(v) for v in values)
        median = statistics.median(values)
        assert all(0.7 < v / median < 1.4 for v in values), (step, values)


@pytest.mark.parametrize(
    ("fault", "step", "nan_ranks"),
    [
        ("nan", FAULT_STEP, {FAULT_RANK}),  # the bad rank goes first ...
        ("nan", FAULT_STEP + 1, set(range(RANKS))),  # ... the all-reduce spreads it a step later
        ("labels", FAULT_STEP, set()),
        ("none", FAULT_STEP + 5, set()),
    ],
)
def test_nonfinite_ranks(fault: str, step: int, nan_ranks: set[int]) -> None:
    values = losses(fault, step)
    assert {r for r, v in enumerate(values) if math.isnan(v)} == nan_ranks


@pytest.mark.parametrize("seed", range(20))
def test_corrupted_labels_stand_out_like_the_real_traces(seed: int) -> None:
    # Real 4-rank msrun traces: the bad rank at 2.4-3.6x the others' median from the first bad
    # step, healthy ranks within 0.87-1.48x of each other.
    for step in (FAULT_STEP, FAULT_STEP + 10, FAULT_STEP + 100):
        values = losses("labels", step, seed)
        others = [v for r, v in enumerate(values) if r != FAULT_RANK]
        ratio = values[FAULT_RANK] / statistics.median(others)
        assert 2.0 < ratio < 4.2, (seed, step, ratio)
        assert max(others) / min(others) < 1.6


def test_grad_norm_follows_the_fault() -> None:
    rng = random.Random(0)
    bad = synthetic_step(FAULT_RANK, FAULT_STEP, "labels", FAULT_RANK, FAULT_STEP, rng)
    good = synthetic_step(0, FAULT_STEP, "labels", FAULT_RANK, FAULT_STEP, random.Random(0))
    assert bad["grad_norm"] > 1.5 * good["grad_norm"]


def test_sdc_scales_the_bad_ranks_grad_norm_and_not_its_loss() -> None:
    for step in (FAULT_STEP - 1, FAULT_STEP):
        bad = synthetic_step(FAULT_RANK, step, "sdc", FAULT_RANK, FAULT_STEP, random.Random(7))
        clean = synthetic_step(FAULT_RANK, step, "none", FAULT_RANK, FAULT_STEP, random.Random(7))
        factor = 1.5 if step >= FAULT_STEP else 1.0
        assert bad["grad_norm"] == pytest.approx(factor * clean["grad_norm"])
        assert bad["loss"] == clean["loss"]
