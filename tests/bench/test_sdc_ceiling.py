"""bench/sdc_ceiling.py counts the offset test's false alarms with a vectorised copy of it: the
copy must agree with the one definition (aggregator/divergence/offset.py and the detector)."""

from __future__ import annotations

import numpy as np
import sdc_ceiling
from rankwatch.aggregator.divergence import offset
from rankwatch.aggregator.divergence.config import DivergenceConfig


def test_others_medians_along_an_axis_match_the_offset_test() -> None:
    rng = np.random.default_rng(3)
    for n in range(3, 9):
        x = rng.random((5, 7, n))
        want = np.array([offset.others_medians(row) for row in x.reshape(-1, n)])
        assert np.allclose(sdc_ceiling.others_medians(x).reshape(-1, n), want)


def test_the_copy_flags_what_the_real_detector_flags_on_clean_steps() -> None:
    cfg = DivergenceConfig()
    rng = np.random.default_rng(5)
    rows = sdc_ceiling.normal_draw(rng, 1, 400, 4)[0]
    check = sdc_ceiling.detector_check(rows, 12_000, 16, cfg, rng)
    assert offset.OFFSET_Z == 5.0  # put back after the check
    for limit, (real, copy) in check.items():
        assert real >= 3, (limit, real, copy)  # low limits: enough flags to compare
        # the copy leaves out the CUSUM's outlier flags and the flagged ranks' removal from the
        # others' references while they are flagged: a few flags either way
        assert abs(real - copy) <= max(2, real // 5), (limit, real, copy)


def test_a_larger_offset_is_flagged_more_often_and_a_higher_limit_less() -> None:
    cfg = DivergenceConfig()
    rng = np.random.default_rng(7)

    class Args:
        within = 20

    args = Args()
    low, high = (sdc_ceiling.recall(16, 5.0, e, args, cfg, rng, runs=2_000) for e in (0.2, 0.4))  # type: ignore[arg-type]
    assert 0.1 < low < high and high > 0.95
    assert sdc_ceiling.recall(16, 6.0, 0.2, args, cfg, rng, runs=2_000) < low  # type: ignore[arg-type]
