"""Cross-rank divergence: statistics, confirmation, directions, small worlds, robustness."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import astuple, replace

import numpy as np
import pytest
from rankwatch.aggregator.divergence.detector import (
    Divergence,
    DivergenceConfig,
    DivergenceDetector,
    MetricRule,
    StepResult,
    step_lag,
)
from rankwatch.aggregator.merge import StepValues


def sv(step: int, values: dict[int, float], metric: str = "loss", run: str = "r") -> StepValues:
    return StepValues(run, metric, step, values, len(values), True)


def feed(
    det: DivergenceDetector, rows: Sequence[dict[int, float]], metric: str = "loss", first: int = 1
) -> list[StepResult]:
    return [det.update(sv(first + i, row, metric)) for i, row in enumerate(rows)]


def new(results: list[StepResult]) -> list[Divergence]:
    return [d for r in results for d in r.new]


def noisy(n: int, steps: int, seed: int, sigma: float = 0.05, mu: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return mu * (1 + sigma * rng.standard_normal((steps, n)))


def rows_of(matrix: np.ndarray) -> list[dict[int, float]]:
    return [dict(enumerate(row.tolist())) for row in matrix]


# --- statistics ------------------------------------------------------------------------------


def test_step_stats_match_numpy() -> None:
    values = np.random.default_rng(0).normal(3.0, 1.0, 1_000)
    res = DivergenceDetector().update(sv(1, dict(enumerate(values.tolist()))))
    s = res.stats
    med = np.median(values)
    assert (s.n, s.step, s.metric) == (1_000, 1, "loss")
    assert s.median == pytest.approx(med)
    assert s.mad == pytest.approx(np.median(np.abs(values - med)))
    assert (s.mean, s.min, s.max) == pytest.approx((values.mean(), values.min(), values.max()))
    assert (s.p5, s.p25, s.p75, s.p95) == pytest.approx(
        tuple(np.percentile(values, [5, 25, 75, 95]))
    )


def test_scores_give_robust_z_and_ratio_per_rank() -> None:
    res = DivergenceDetector().update(sv(1, {0: 1.0, 1: 1.1, 2: 0.9, 3: 1.0, 4: 3.0}))
    assert len(res.scores) == 5 and set(res.scores) == {0, 1, 2, 3, 4}
    s4 = res.scores[4]
    assert s4.rel == pytest.approx(3.0)
    assert s4.z == pytest.approx(2.0 / (1.4826 * 0.1))
    assert s4.outlier and not s4.nonfinite and not s4.flagged  # one step is not a divergence
    assert res.new == []
    # Bulk readers get the numpy arrays without building 4,096 objects.
    assert res.scores.ranks.tolist() == [0, 1, 2, 3, 4]
    assert res.scores.z.tolist()[4] == pytest.approx(s4.z)
    assert res.scores.value_array.tolist() == [1.0, 1.1, 0.9, 1.0, 3.0]


@pytest.mark.parametrize(
    ("values", "finite_z"),
    [
        ({r: 1.0 for r in range(8)}, True),  # identical healthy ranks
        ({r: 0.0 for r in range(8)}, True),  # identical at zero
        ({0: 0.0, 1: 0.0, 2: 0.0, 3: 1e-9}, True),  # median 0, one tiny difference
    ],
)
def test_identical_ranks_do_not_give_infinite_z(values: dict[int, float], finite_z: bool) -> None:
    res = DivergenceDetector().update(sv(1, values))
    assert all(math.isfinite(s.z) == finite_z for s in res.scores.values())


def test_zero_median_ratio_is_defined() -> None:
    res = DivergenceDetector().update(sv(1, {0: 0.0, 1: 0.0, 2: 0.0, 3: 2.0, 4: -1.0}))
    assert res.scores[0].rel == 1.0
    assert res.scores[3].rel == math.inf and res.scores[4].rel == -math.inf


# --- confirmation and resolution -------------------------------------------------------------

BASE = {r: 1.0 + 0.01 * ((r + 2) % 3) for r in range(16)}  # rank 5 sits at the median


def with_rank(value: float, rank: int = 5, base: dict[int, float] = BASE) -> dict[int, float]:
    return {**base, rank: value}


@pytest.mark.parametrize(
    ("rows", "flag_step", "direction"),
    [
        ([with_rank(3.0)] * 4, 2, "high"),  # 16 ranks: a large jump confirms in 2 steps
        ([with_rank(0.3)] * 4, 2, "low"),
        ([BASE, BASE, with_rank(3.0), with_rank(3.0), with_rank(3.0)], 4, "high"),
        # a 3x spike every other step adds up: three in a 5-step window (the window test)
        ([with_rank(3.0), BASE] * 5, 5, "high"),
        # a 3x spike one step in three: noise (two in any window, each at most 0.4 of its limit)
        ([with_rank(3.0), BASE, BASE] * 5, None, None),
        ([with_rank(3.0)] + [BASE] * 5, None, None),  # one spike never flags
        ([with_rank(1.03)] * 20, None, None),  # under the 5 % gate: never
    ],
)
def test_confirmation_table(
    rows: list[dict[int, float]], flag_step: int | None, direction: str | None
) -> None:
    got = new(feed(DivergenceDetector(), rows))
    if flag_step is None:
        assert got == []
    else:
        (d,) = got
        assert (d.step, d.rank, d.kind, d.direction) == (flag_step, 5, "outlier", direction)


def test_small_worlds_need_three_steps() -> None:
    base = {0: 1.0, 1: 1.02, 2: 0.98, 3: 1.01}
    got = new(feed(DivergenceDetector(), [{**base, 2: 3.0}] * 5))
    assert [(d.step, d.rank) for d in got] == [(3, 2)]


def test_divergence_explains_itself() -> None:
    det = DivergenceDetector()
    feed(det, [BASE] * 3)
    (d,) = new(feed(det, [with_rank(3.1)] * 3, first=4))
    assert d.since_step == 4 and d.step == 5 and d.n == 16
    assert d.value == 3.1 and d.median == pytest.approx(1.01)
    assert d.rel == pytest.approx(3.1 / 1.01) and d.z > 10
    assert d.message.startswith("rank 5 loss 3.07x the median of 16 ranks (z=")
    assert d.message.endswith("since step 4")
    assert det.active("r") == [d] and det.active("other") == []


def test_resolves_after_clear_steps_clean_steps() -> None:
    det = DivergenceDetector(DivergenceConfig(clear_steps=3))
    feed(det, [with_rank(3.0)] * 3)
    res = feed(det, [BASE] * 4, first=4)
    resolved = [d for r in res for d in r.resolved]
    assert [(d.rank, d.step) for d in resolved] == [(5, 6)]
    assert "back with the others at step 6" in resolved[0].message
    assert det.active() == []
    assert res[0].scores[5].flagged and not res[3].scores[5].flagged


def test_a_flagged_rank_is_reported_once_while_it_stays_away() -> None:
    got = new(feed(DivergenceDetector(), [with_rank(3.0)] * 50))
    assert len(got) == 1


def test_out_of_order_steps_do_not_feed_evidence() -> None:
    det = DivergenceDetector()
    feed(det, [BASE] * 10)
    for _ in range(5):  # stale partial groups arriving after step 10
        assert det.update(sv(3, with_rank(3.0))).new == []


# --- non-finite ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "word", "direction"),
    [(math.nan, "NaN", "high"), (math.inf, "+Inf", "high"), (-math.inf, "-Inf", "low")],
)
def test_nonfinite_is_flagged_at_once(value: float, word: str, direction: str) -> None:
    det = DivergenceDetector()
    res = det.update(sv(7, with_rank(value)))
    (d,) = res.new
    assert (d.kind, d.rank, d.direction, d.step, d.since_step) == ("nonfinite", 5, direction, 7, 7)
    assert d.message.startswith(f"rank 5 loss is {word} at step 7")
    assert res.scores[5].nonfinite and math.isnan(res.scores[5].z)
    assert res.stats.n == 15  # the others are still scored
    assert det.update(sv(8, with_rank(value))).new == []  # reported once


def test_nonfinite_resolves_after_clear_steps_finite_steps() -> None:
    det = DivergenceDetector(DivergenceConfig(clear_steps=2))
    det.update(sv(1, with_rank(math.nan)))
    assert det.update(sv(2, BASE)).resolved == []
    (d,) = det.update(sv(3, BASE)).resolved
    assert d.kind == "nonfinite" and "finite again at step 3" in d.message


def nan_equal(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        x == y
        or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        for x, y in zip(a, b, strict=True)
    )


def test_a_cascade_flags_every_rank_as_one_flag_at_a_time_would() -> None:
    """Every rank's non-finite flag goes in at once (one update of the active flags), each the
    Divergence the rule's own words make: the world large enough for the batched scoring."""
    ranks = 5000
    values = {r: 1.0 + r % 7 * 1e-3 for r in range(ranks)}
    det = DivergenceDetector()
    feed(det, [values] * 3)
    bad = {r: math.nan for r in range(ranks)} | {7: math.inf, 9: -math.inf}
    res = det.update(sv(4, {**values, **bad}))
    n, median = res.stats.n, res.stats.median
    assert n == 0 and math.isnan(median)
    by_rank = {d.rank: d for d in res.new}
    assert len(res.new) == len(by_rank) == ranks
    for rank, value in bad.items():
        word = {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, "NaN")
        want = Divergence("r", "loss", rank, "nonfinite", "low" if value < 0 else "high", 4, 4,
                          value, median, math.nan, math.nan,
                          f"rank {rank} loss is {word} at step 4", n)  # fmt: skip
        assert nan_equal(astuple(by_rank[rank]), astuple(want)), rank
    again = replace(by_rank[7], step=5)  # a flag made so is a dataclass like any other
    assert (again.step, again.since_step, again.value) == (5, 4, math.inf)
    assert {(d.run, d.rank, d.kind) for d in det.active("r")} == {
        ("r", r, "nonfinite") for r in range(ranks)}  # fmt: skip
    assert det.update(sv(5, bad)).new == []  # flagged once


def test_nan_on_every_rank() -> None:
    res = DivergenceDetector().update(sv(1, {r: math.nan for r in range(4)}))
    assert res.stats.n == 0 and math.isnan(res.stats.median)
    assert sorted(d.rank for d in res.new) == [0, 1, 2, 3]


# --- per-metric rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "value", "flagged"),
    [
        ("throughput", 0.3, True),  # a straggler
        ("throughput", 3.0, False),  # a fast rank is fine
        ("train/throughput", 0.3, True),  # matched by its last path segment
        ("step_time", 3.0, True),
        ("step_time", 0.3, False),
        ("loss_scale", 3.0, False),  # excluded
        ("loss", 3.0, True),
        ("loss", 0.3, True),
        ("grad_norm", 3.0, True),  # unknown metrics: both directions
    ],
)
def test_directions_per_metric(metric: str, value: float, flagged: bool) -> None:
    got = new(feed(DivergenceDetector(), [with_rank(value)] * 6, metric=metric))
    assert bool(got) == flagged


@pytest.mark.parametrize(("factor", "flagged"), [(1.0, False), (1.00001, False), (1.001, True)])
def test_lr_must_match_exactly(factor: float, flagged: bool) -> None:
    lr = {r: 3e-4 for r in range(8)}
    got = new(feed(DivergenceDetector(), [{**lr, 3: 3e-4 * factor}] * 6, metric="lr"))
    assert bool(got) == flagged


def test_custom_rules_from_dict() -> None:
    cfg = DivergenceConfig.from_dict({"rules": {"acc": "low", "loss": {"direction": "off"}}})
    assert cfg.rule("acc").direction == "low" and cfg.rule("loss").direction == "off"
    assert cfg.rule("throughput").direction == "low"  # defaults kept
    assert new(feed(DivergenceDetector(cfg), [with_rank(3.0)] * 6, metric="loss")) == []


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"z_treshold": 3}, "unknown divergence setting 'z_treshold'"),
        ({"confirm_steps": 0}, "confirm_steps=0"),
        ({"high_ratio": "big"}, "'high_ratio' must be a number"),
        ({"clear_steps": 2.5}, "'clear_steps' must be an integer"),
        ({"high_ratio": True}, "'high_ratio' must be a number"),
        ({"rules": {"loss": "sideways"}}, "direction 'sideways'"),
        ({"rules": {"loss": {"ratio": 2}}}, "unknown key 'ratio' in divergence rule for 'loss'"),
        ({"low_ratio": 1.5}, "low_ratio=1.5"),
    ],
)
def test_config_errors_name_the_setting(raw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DivergenceConfig.from_dict(raw)


def test_metric_rule_rejects_bad_direction() -> None:
    with pytest.raises(ValueError, match="direction"):
        MetricRule("up")


# --- two and three ranks ---------------------------------------------------------------------


def pair_rows(n: int, a: float, b: float, drift: float = 0.0) -> list[dict[int, float]]:
    """Two healthy ranks with a little alternating noise, both following a common trend."""
    out = []
    for i in range(n):
        wiggle = 0.02 if i % 2 else -0.02
        level = 1.0 - drift * i
        out.append({0: a * level * (1 + wiggle), 1: b * level * (1 - wiggle)})
    return out


def test_pair_blames_the_rank_that_moved_from_its_own_level() -> None:
    det = DivergenceDetector()
    rows = pair_rows(10, 1.0, 1.05, drift=0.01)
    rows += [{0: r[0], 1: r[1] * 3} for r in pair_rows(6, 1.0, 1.05, drift=0.01)]
    (d,) = new(feed(det, rows))
    assert d.rank == 1 and d.direction == "high" and d.confident and d.since_step == 11
    assert "rank 1 loss" in d.message and "rank 0" in d.message and "2 ranks" in d.message


def test_pair_names_the_low_rank_when_it_is_the_one_that_changed() -> None:
    rows = pair_rows(10, 1.0, 1.0) + [{0: r[0] * 0.3, 1: r[1]} for r in pair_rows(6, 1.0, 1.0)]
    (d,) = new(feed(DivergenceDetector(), rows))
    assert (d.rank, d.direction, d.confident) == (0, "low", True)


def test_pair_that_both_changed_is_flagged_without_confidence() -> None:
    rows = pair_rows(10, 1.0, 1.0)
    rows += [{0: r[0] * 0.5, 1: r[1] * 1.6} for r in pair_rows(6, 1.0, 1.0)]
    (d,) = new(feed(DivergenceDetector(), rows))
    assert not d.confident and "cannot tell which rank changed" in d.message


def test_pair_throughput_rise_on_one_rank_is_not_the_other_ranks_fault() -> None:
    rows = pair_rows(10, 100.0, 100.0)
    rows += [{0: r[0], 1: r[1] * 3} for r in pair_rows(6, 100.0, 100.0)]
    assert new(feed(DivergenceDetector(), rows, metric="throughput")) == []


def test_pair_needs_a_warmup_before_scoring() -> None:
    assert new(feed(DivergenceDetector(), [{0: 1.0, 1: 3.0}] * 4)) == []


def test_three_ranks_flag_only_the_bad_one() -> None:
    # Leave-one-out would compare rank 0 with the mean of ranks 1 and 2 (the bad one), making
    # the healthy rank look 0.5x: the median of three is the healthy middle value instead.
    rows = [{0: 1.0, 1: 1.03, 2: 0.98}] * 5 + [{0: 1.0, 1: 1.03, 2: 2.9}] * 5
    got = new(feed(DivergenceDetector(), rows))
    assert [(d.rank, d.direction) for d in got] == [(2, "high")]


# --- step lag --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last", "lagging"),
    [
        ({0: 100, 1: 100, 2: 99, 3: 100}, []),
        ({0: 100, 1: 100, 2: 50, 3: 100}, [2]),
        ({0: 100, 1: 100, 2: 81, 3: 100}, []),  # 19 behind: within 20
        ({0: 100, 1: 79, 2: 100, 3: 100}, [1]),
        ({0: 100}, []),
        ({r: 1000 + (r % 50) for r in range(256)} | {7: 900}, [7]),
        ({r: 1000 + 10 * (r % 50) for r in range(256)}, []),  # async ranks spread widely
    ],
)
def test_step_lag_table(last: dict[int, int], lagging: list[int]) -> None:
    got = step_lag("r", last, DivergenceConfig())
    assert [d.rank for d in got] == lagging
    for d in got:
        assert d.kind == "straggler" and d.direction == "low" and "steps behind" in d.message


# --- robustness at scale (seeded noise) ------------------------------------------------------


def test_1024_ranks_of_clean_noise_are_never_flagged() -> None:
    det = DivergenceDetector()
    data = noisy(1_024, 300, seed=11)
    assert (
        new([det.update(sv(i, dict(enumerate(row.tolist())))) for i, row in enumerate(data)]) == []
    )


def drift_latency(
    shift_sigma: float, seeds: range, n: int = 1_024, config: DivergenceConfig | None = None
) -> list[int]:
    """Steps from onset until each drifting rank is flagged (99 if never within 15 steps)."""
    drifting = list(range(0, n, 103))
    lat = []
    for seed in seeds:
        data = noisy(n, 25, seed)
        data[10:, drifting] += 2.0 * 0.05 * shift_sigma
        det = DivergenceDetector(config)
        first: dict[int, int] = {}
        for i, row in enumerate(data):
            for d in det.update(sv(i, dict(enumerate(row.tolist())))).new:
                assert d.rank in drifting and i >= 10, f"false flag {d.message}"
                first.setdefault(d.rank, i - 10)
        lat += [first.get(r, 99) for r in drifting]
    return lat


def test_a_3_sigma_drift_is_flagged_within_5_steps() -> None:
    # At 1,024 ranks the limit is 6.60 (limit_for), one step more than at 8 ranks: ~70 % within
    # 5 steps, median 5, for ~100x fewer false alarms than the 8-rank limit would raise here.
    lat = drift_latency(3.0, range(5))
    within5 = sum(x <= 4 for x in lat) / len(lat)
    assert within5 >= 0.6, lat
    assert max(lat) <= 12, lat


def test_one_limit_at_every_size_trades_false_alarms_for_speed() -> None:
    config = DivergenceConfig(evidence_per_doubling=0)
    lat = drift_latency(3.0, range(5), config=config)
    within5 = sum(x <= 4 for x in lat) / len(lat)
    assert within5 >= 0.85, lat  # ~90 % measured; CUSUM at 1e-6 false flags cannot do much more
    assert max(lat) <= 9, lat


def test_a_4_sigma_drift_is_always_flagged_within_5_steps() -> None:
    assert max(drift_latency(4.0, range(3))) <= 4


@pytest.mark.parametrize(
    ("n", "per_doubling", "limit"),
    [(2, 0.25, 4.5), (8, 0.25, 4.5), (16, 0.25, 4.75), (1_024, 0.25, 6.25), (4_096, 0.25, 6.75),
     (4_096, 0.0, 4.5), (100, 1.0, 4.5 + math.log2(12.5))],
)  # fmt: skip
def test_the_limit_grows_with_the_log_of_the_ranks(
    n: int, per_doubling: float, limit: float
) -> None:
    config = DivergenceConfig(evidence_per_doubling=per_doubling)
    assert config.grown_limit(n) == pytest.approx(limit)
    if n == 2 or n >= 64:  # a pair, and big worlds: z is scored on the normal model
        assert config.limit_for(n) == config.grown_limit(n)


@pytest.mark.parametrize(
    ("n", "per_doubling", "flag_at"),
    [
        (16, 0.25, 3),  # limit 4.75: z = -3.5 adds 2 per step, evidence 6 at the third step
        (100, 1.0, 5),  # limit 8.14 (lists path): 8 after four steps is not enough
        (4_096, 0.25, 4),  # limit 6.75 (numpy path): a fourth step
        (4_096, 0.0, 3),  # one limit at every size: as at 16 ranks
    ],
)
def test_a_bigger_world_needs_more_evidence_for_the_same_deviation(
    n: int, per_doubling: float, flag_at: int
) -> None:
    # The others take the normal quantiles around 2.0 (sigma 0.1), shuffled at every step:
    # median 2.0, scale 0.1, and no other rank stays at an extreme.
    ppf = statistics.NormalDist().inv_cdf
    others = np.array([2.0 * (1 + 0.05 * ppf((i + 0.5) / (n - 1))) for i in range(n - 1)])
    rng = np.random.default_rng(n)

    def step(probe: float) -> dict[int, float]:
        return {0: probe, **dict(enumerate(rng.permutation(others).tolist(), start=1))}

    # the CUSUM alone: the window test's limit grows with the ranks too (test_window.py)
    config = DivergenceConfig(evidence_per_doubling=per_doubling, window_steps=0)
    det = DivergenceDetector(config)
    assert new(feed(det, [step(2.0) for _ in range(10)])) == []
    bad = [step(2.0 * (1 - 0.05 * 3.5)) for _ in range(6)]  # z = -3.5
    flags = [[d.rank for d in r.new] for r in feed(det, bad, first=11)]
    assert [f for f in flags if f] == [[0]], flags
    flags = [len(f) for f in flags]
    assert flags.index(1) + 1 == flag_at, flags


@pytest.mark.parametrize(
    ("jitter_s", "slow_rank_s", "flagged"),
    [
        (0.002, None, False),  # millisecond loader jitter: never a straggler
        (0.004, 0.008, False),  # a few ms slower than the others, under the 10 ms floor
        (0.002, 0.5, True),  # a data loader stalling half a second per step
        (0.0005, 0.05, True),  # 100x the others and 50 ms: a real straggler
    ],
)
def test_data_time_flags_a_slow_loader_not_jitter(
    jitter_s: float, slow_rank_s: float | None, flagged: bool
) -> None:
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(12):
        row = {r: float(abs(rng.normal(0.001, jitter_s))) for r in range(4)}
        if slow_rank_s is not None:
            row[2] = slow_rank_s
        rows.append(row)
    got = new(feed(DivergenceDetector(), rows, metric="data_time"))
    assert {d.rank for d in got} == ({2} if flagged else set())
