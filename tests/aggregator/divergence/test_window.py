"""The window-sum test and the pooled scale: limits from the false-alarm budget, what they flag.

Pure, seeded, no sockets.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import pytest
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.divergence.window import (
    GRID,
    scale_error,
    step_pmf,
    sum_tail,
    sum_tail_limit,
    window_limit,
)
from rankwatch.aggregator.merge import StepValues

CFG = DivergenceConfig()


def test_the_limit_spends_the_budget_and_grows_with_the_ranks() -> None:
    limits = [window_limit(CFG, n) for n in (8, 64, 1_024, 4_096)]
    hs = [h for h, _ in limits]
    assert hs[1:] == sorted(hs[1:])  # more ranks, each held to less
    assert hs[0] > hs[1]  # 8 ranks: a less certain scale, so a higher limit
    for h, cap in limits:
        assert 2 * cap < h <= 3 * cap  # two steps never flag alone, three can
    # h is the first grid point whose tail is within alpha: one grid point lower is not
    alpha = CFG.window_alpha(1_024)
    assert alpha == pytest.approx(0.06 / (3600 * 1_024 * 5 * 2))
    h, cap = limits[2]
    tail = sum_tail(CFG.window_steps, CFG.window_allowance, cap, scale_error(CFG, 1_024))
    k = round(h / GRID)
    assert tail[k] <= alpha < tail[k - 1]
    # the tail by FFT is the plain convolution's
    one = step_pmf(CFG.window_allowance, cap)
    pmf = one
    for _ in range(CFG.window_steps - 1):
        pmf = np.convolve(pmf, one)
    assert pmf[k:].sum() == pytest.approx(sum_tail(CFG.window_steps, 0.5, cap)[k], rel=1e-6)


def test_the_derived_limit_holds_its_rate_on_normal_noise() -> None:
    # At a rate Monte Carlo can count: the sum of 5 steps of min(max(z - 0.5, 0), cap) passes
    # the limit for alpha in at most alpha of the windows, and not far less (rounding up).
    rng = np.random.default_rng(1)
    alpha, cap = 5e-3, 2.0
    h = sum_tail_limit(5, 0.5, cap, alpha)
    u = np.minimum(np.maximum(rng.standard_normal((400_000, 5)) - 0.5, 0.0), cap)
    rate = float((u.sum(axis=1) >= h).mean())
    assert 0.8 * alpha < rate <= 1.1 * alpha  # 2,000 expected: +-5 % is 2.2 sigma


def drift_world(n: int, shift: float, seed: int, onset: int = 40, steps: int = 45) -> list:
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        row = 2.0 * (1 + 0.05 * rng.standard_normal(n))
        if step >= onset:
            row[3] += 2.0 * 0.05 * shift
        rows.append(StepValues("r", "loss", step, dict(enumerate(row.tolist())), n, True))
    return rows


def first_flag(config: DivergenceConfig, rows: list) -> tuple[int, int] | None:
    det = DivergenceDetector(config)
    for sv in rows:
        for d in det.update(sv).new:
            return sv.step, d.since_step
    return None


SHIFT = 2.75  # sigma: where the CUSUM alone at 64 ranks is most often just too slow


def test_a_shift_is_flagged_within_5_steps_where_the_cusum_alone_is_not() -> None:
    cusum = dataclasses.replace(CFG, window_steps=0)
    both = [first_flag(CFG, drift_world(64, SHIFT, s)) for s in range(60)]
    alone = [first_flag(cusum, drift_world(64, SHIFT, s)) for s in range(60)]
    within = [f is not None and f[0] <= 44 for f in both]
    within_alone = [f is not None and f[0] <= 44 for f in alone]
    # either test flags: never later than the CUSUM alone, and here and there in time where
    # it is not (model, 3 sigma: 0.85 -> 0.88 of the ranks at 64; far more at 1,024)
    assert all(a or not b for a, b in zip(within, within_alone, strict=True))
    assert sum(within) > sum(within_alone) and sum(within) >= 40
    # a flag says its divergence began where its window's first step that stood out did: the
    # onset, or a noisy step just before it
    since = [f[1] for f in both if f is not None]
    assert set(since) <= set(range(36, 42)) and statistics.mode(since) == 40


def test_clean_small_worlds_stay_quiet_against_the_pooled_scale() -> None:
    # 8 ranks of 5 % gaussian noise: the step's own MAD of 8 values gave heavy-tailed z and
    # about four false alarms an hour on this metric alone; the pooled scale none.
    rng = np.random.default_rng(7)
    det = DivergenceDetector()
    flags = 0
    for step in range(7_200):
        row = 2.0 * (1 + 0.05 * rng.standard_normal(8))
        flags += len(det.update(StepValues("r", "loss", step, dict(enumerate(row.tolist())),
                                           8, True)).new)  # fmt: skip
    assert flags <= 1
