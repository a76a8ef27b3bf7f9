"""The two scoring paths (lists for small worlds, numpy for large ones) give identical results.

Pure, seeded. The numpy path is forced by setting ``PY_MAX_RANKS`` to 0 for one detector; both
detectors see the same steps and every StepResult is compared field by field, floats exactly
(through repr, so NaN compares equal to NaN).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import numpy as np
import pytest
from rankwatch.aggregator.divergence import detector as divergence
from rankwatch.aggregator.divergence.detector import DivergenceDetector, RankScores, StepResult
from rankwatch.aggregator.divergence.lists import np_sum, step_stats
from rankwatch.aggregator.merge import StepValues

METRICS = ("loss", "throughput", "step_time", "lr", "grad_norm", "data_time", "loss_scale")


def dump(res: StepResult) -> tuple:
    scores = [(r, repr(s)) for r, s in res.scores.items()]
    return repr(res.stats), scores, [repr(d) for d in res.new], [repr(d) for d in res.resolved]


def run_both(
    monkeypatch: pytest.MonkeyPatch, metric: str, rows: list[tuple[int, dict[int, float]]]
) -> Iterator[tuple[tuple, tuple]]:
    """(lists result, numpy result) per step; PY_MAX_RANKS decides each detector's path."""
    small, large = DivergenceDetector(), DivergenceDetector()
    for step, row in rows:
        monkeypatch.setattr(divergence, "PY_MAX_RANKS", 128)
        a = small.update(StepValues("r", metric, step, dict(row), len(row), True))
        monkeypatch.setattr(divergence, "PY_MAX_RANKS", 0)
        b = large.update(StepValues("r", metric, step, dict(row), len(row), True))
        yield dump(a), dump(b)


def scenario(seed: int) -> tuple[str, list[tuple[int, dict[int, float]]]]:
    """A small world with noise, a rank that drifts (and maybe recovers), non-finite values,
    missing ranks, shuffled rank order and out-of-order steps."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 2, 3, 4, 5, 8, 16, 33, 128])
    metric = rng.choice(METRICS)
    mu = rng.choice([2.0, 0.0, 1e-3, 100.0, -1.0])
    sigma = rng.choice([0.0, 0.01, 0.05, 0.3])
    steps = rng.randint(5, 40)
    bad, onset = rng.randrange(n), rng.randint(0, steps)
    end = onset + (10 if seed % 2 else steps)
    factor = rng.choice([1.02, 1.5, 3.0, 0.3, 0.0, -2.0])
    rows = []
    for s in range(steps):
        row = {}
        for r in range(n):
            x = mu * (1 + sigma * rng.gauss(0, 1)) + (rng.gauss(0, 0.01) if mu == 0 else 0.0)
            if r == bad and onset <= s < end:
                x *= factor
            if rng.random() < 0.02:
                x = rng.choice([math.nan, math.inf, -math.inf])
            if rng.random() > 0.02:  # else the rank is missing from this step
                row[r] = x
        keys = list(row)
        if rng.random() < 0.2:
            rng.shuffle(keys)
        step = s if rng.random() > 0.05 else max(0, s - rng.randint(1, 4))
        rows.append((step, {k: row[k] for k in keys}))
    return metric, rows


@pytest.mark.parametrize("seed", range(0, 300, 3))
def test_lists_and_numpy_agree_on_random_worlds(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    metric, rows = scenario(seed)
    for i, (a, b) in enumerate(run_both(monkeypatch, metric, rows)):
        assert a == b, f"seed {seed}, step index {i}"


@pytest.mark.parametrize(
    ("metric", "rows"),
    [
        # a 3x jump confirmed, then back: flagged and resolved on both paths
        ("loss", [(s, {r: 1.0 + 0.01 * r + (2.0 if r == 3 and 5 <= s < 12 else 0.0)
                       for r in range(8)}) for s in range(25)]),
        # a pair: warm-up, own levels, blame
        ("loss", [(s, {0: 1.0 + 0.02 * (s % 2), 1: (3.0 if s >= 10 else 1.05)})
                  for s in range(16)]),
        # NaN on one rank for a while, then finite again
        ("grad_norm", [(s, {r: (math.nan if r == 1 and 2 <= s < 5 else 1.0 + 0.01 * r)
                            for r in range(4)}) for s in range(12)]),
        # median 0: rel is 1 or +-inf
        ("loss", [(s, {0: 0.0, 1: 0.0, 2: 0.0, 3: 2.0, 4: -1.0}) for s in range(8)]),
        # lr: exact-match rules
        ("lr", [(s, {r: 3e-4 * (1.001 if r == 3 else 1.0) for r in range(8)}) for s in range(8)]),
    ],
)  # fmt: skip
def test_lists_and_numpy_agree_on_named_cases(
    monkeypatch: pytest.MonkeyPatch, metric: str, rows: list[tuple[int, dict[int, float]]]
) -> None:
    results = list(run_both(monkeypatch, metric, rows))
    assert any(a[2] or a[3] for a, _ in results) or metric == "lr"  # something happened
    for a, b in results:
        assert a == b


@pytest.mark.parametrize("seed", range(1, 300, 10))
@pytest.mark.parametrize("list_limit", [128, 0])
def test_update_array_is_update(
    monkeypatch: pytest.MonkeyPatch, seed: int, list_limit: int
) -> None:
    # the arrays a grid's row is scored from give the StepValues' verdicts and state, on
    # either path (list_limit 0: every world is scored with numpy from the arrays as given)
    from tests.aggregator.divergence.test_divergence_batch import state_dump

    monkeypatch.setattr(divergence, "PY_MAX_RANKS", list_limit)
    metric, rows = scenario(seed)
    by_dict, by_array = DivergenceDetector(), DivergenceDetector()
    for step, row in rows:
        a = by_dict.update(StepValues("r", metric, step, dict(row), len(row), True))
        ranks = np.fromiter(row.keys(), np.int64, len(row))
        values = np.fromiter(row.values(), np.float64, len(row))
        b = by_array.update_array("r", metric, step, ranks, values, len(row))
        assert dump(a) == dump(b)
    assert state_dump(by_dict) == state_dump(by_array)


def test_a_world_that_grows_past_the_list_limit_switches_to_numpy_keeping_its_state() -> None:
    det, ref = DivergenceDetector(), DivergenceDetector()
    rows = noisy_rows(8, 30, seed=3) + noisy_rows(200, 10, seed=4)  # rank 199 > PY_MAX_RANKS
    for i, row in enumerate(rows):
        row = {**row, 5: row[5] * (3.0 if i >= 20 else 1.0)}  # rank 5 drifts across the switch
        a = det.update(StepValues("r", "loss", i, row, len(row), True))
        b = ref.update(StepValues("r", "loss", i, row, len(row), True))
        assert dump(a) == dump(b)
    assert [d.rank for d in det.active()] == [5]


def noisy_rows(n: int, steps: int, seed: int) -> list[dict[int, float]]:
    rng = np.random.default_rng(seed)
    data = 2.0 * (1 + 0.05 * rng.standard_normal((steps, n)))
    return [dict(enumerate(row.tolist())) for row in data]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 15, 16, 17, 64, 127, 128])
def test_list_statistics_are_numpys_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    for trial in range(200):
        v = rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)
        if trial % 3 == 0:
            v = np.round(v, 1)  # ties
        med = float(np.percentile(v, 50.0))
        p5, p25, p75, p95 = np.percentile(v, [5.0, 25.0, 75.0, 95.0]).tolist()
        expected = (med, float(np.median(np.abs(v - med))), float(v.mean()), float(v.min()),
                    float(v.max()), p5, p25, p75, p95)  # fmt: skip
        assert step_stats(v.tolist()) == expected
        assert np_sum(v.tolist()) == float(np.add.reduce(v))


def test_np_sum_refuses_more_values_than_it_can_order_like_numpy() -> None:
    with pytest.raises(ValueError, match="<= 128 values"):
        np_sum([1.0] * 129)


def test_rank_scores_from_lists_give_arrays_and_objects() -> None:
    scores = RankScores([3, 1], [2.0, math.nan], [1.5, math.nan], [1.2, math.nan],
                        (True, False), frozenset({3}))  # fmt: skip
    assert scores.ranks.dtype == np.int64 and scores.ranks.tolist() == [3, 1]
    assert scores.outlier.dtype == np.bool_ and scores.outlier.tolist() == [True, False]
    assert scores.value_array.tolist()[0] == 2.0 and math.isnan(scores.z.tolist()[1])
    assert list(scores) == [3, 1] and len(scores) == 2
    s3, s1 = scores[3], scores[1]
    assert (s3.value, s3.z, s3.rel, s3.outlier, s3.nonfinite, s3.flagged) == (
        2.0, 1.5, 1.2, True, False, True
    )  # fmt: skip
    assert s1.nonfinite and not s1.flagged
    z = scores.z_map()
    assert z[3] == 1.5 and math.isnan(z[1])
