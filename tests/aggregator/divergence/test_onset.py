"""The step a flag is dated to ("since step N"): a large shift after a step of noise that
passed the CUSUM's allowance is dated to the shift, on both scoring paths and in the window
test; a run whose first step is weak but a step of the shift keeps it."""

from __future__ import annotations

import numpy as np
import pytest
from rankwatch.aggregator.divergence import detector as divergence
from rankwatch.aggregator.divergence import onset
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.merge import StepValues

# --- the estimate itself -----------------------------------------------------------------------


def sums(zs: list[float], lead: int) -> tuple[float, float, float, float]:
    return (sum(zs), sum(z * z for z in zs), sum(zs[:lead]), sum(z * z for z in zs[:lead]))


def test_a_run_without_a_step_past_the_threshold_keeps_its_start() -> None:
    assert onset.since(10, onset.NONE, sums([2.0, 2.5, 2.0], 0), 12) == 10
    assert onset.since(10, 10, sums([50.0, 50.0], 0), 11) == 10  # its first step stood out


def test_noise_then_a_large_shift_is_dated_to_the_shift() -> None:
    # z 1.9 at step 11 (noise past the allowance 1.5), then 50 and 50
    assert onset.since(11, 12, sums([1.9, 50.0, 50.0], 1), 13) == 12


def test_a_weak_first_step_of_a_shift_that_varies_stays_the_onset() -> None:
    # the real corrupted-labels rank of the 4-rank msrun job: z 2.8, then 11.6, 7.4 and 4.0;
    # 2.8 is likelier a step of that shift (mean 7.7, spread 3.8) than noise
    assert onset.since(12, 13, sums([2.82, 11.63, 7.38, 4.02], 1), 15) == 12


def test_a_weak_first_step_of_a_small_shift_stays_the_onset() -> None:
    assert onset.since(30, 31, sums([2.2, 3.4, 3.1, 3.6], 1), 33) == 30


def test_a_jump_seen_on_the_flag_step_only_keeps_the_start() -> None:
    # a slow climb, then one step far out as the flag comes: one step says nothing of the
    # shift's spread, so the climb's first step stays the date
    assert onset.since(10, 14, sums([1.6, 0.9, 1.2, 1.4, 3.5], 4), 14) == 10


def test_two_steps_of_noise_before_a_shift_both_drop() -> None:
    assert onset.since(27, 30, sums([1.7, 1.7, 0.3, 50.0, 50.8], 3), 31) == 30


def test_note_keeps_the_sums_of_the_run_and_restarts_with_a_new_one() -> None:
    run, out = [[0.0] * 2 for _ in range(4)], [onset.NONE] * 2
    expected = [100.9, 1.9**2 + 50.0**2 + 49.0**2, 1.9, 1.9**2]  # sums, then the lead's
    for step, z, began in ((11, 1.9, True), (12, 50.0, False), (13, 49.0, False)):
        onset.note(run, out, 1, step, z, began, 3.0)
    assert out[1] == 12 and [row[1] for row in run] == pytest.approx(expected)
    onset.note(run, out, 1, 20, 2.0, True, 3.0)  # a new run
    assert (run[0][1], run[1][1], out[1]) == (2.0, 4.0, onset.NONE)
    arrays, outs = np.zeros((4, 2)), np.full(2, onset.NONE)
    for step, z, began in ((11, 1.9, True), (12, 50.0, False), (13, 49.0, False)):
        onset.note_arrays(arrays, outs, np.array([1]), step, np.array([z]), np.array([began]), 3.0)
    assert outs.tolist() == [onset.NONE, 12] and not arrays[:, 0].any()
    assert arrays[:, 1].tolist() == pytest.approx(expected)


# --- in the detector -----------------------------------------------------------------------------


def stall_world(n: int, blip: float, stall: float) -> list[StepValues]:
    """data_time of ``n`` ranks (~1 ms, 0.1 ms of jitter); rank 2 has a ``blip`` at step 11
    (a host hiccup) and loads ``stall`` seconds slower from step 12 on."""
    rng = np.random.default_rng(5)
    rows = []
    for step in range(1, 20):
        v = 0.001 + 0.0001 * rng.standard_normal(n)
        if step == 11:
            v[2] = blip
        if step >= 12:
            v[2] += stall
        rows.append(StepValues("r", "data_time", step, dict(enumerate(v.tolist())), n, True))
    return rows


def first_flag(rows: list[StepValues]) -> tuple[int, int, int]:
    det = DivergenceDetector()
    for sv in rows:
        for d in det.update(sv).new:
            return d.rank, sv.step, d.since_step
    raise AssertionError("never flagged")


@pytest.mark.parametrize("path_limit", [128, 0], ids=["lists", "numpy"])
@pytest.mark.parametrize("n", [4, 64])
def test_a_stalled_loader_after_a_host_hiccup_is_dated_to_the_stall(
    monkeypatch: pytest.MonkeyPatch, n: int, path_limit: int
) -> None:
    # the real failure: 4 ranks under msrun, a 20 ms hiccup on rank 2 one step before its
    # loader stalls for 0.5 s; with the data_time floor of 10 ms the hiccup is z ~1.9
    monkeypatch.setattr(divergence, "PY_MAX_RANKS", path_limit)
    rank, _, since = first_flag(stall_world(n, 0.02, 0.5))
    assert (rank, since) == (2, 12)


@pytest.mark.parametrize("path_limit", [128, 0], ids=["lists", "numpy"])
def test_a_slow_start_of_a_real_stall_is_still_its_onset(
    monkeypatch: pytest.MonkeyPatch, path_limit: int
) -> None:
    # the loader is 25 ms slow from step 11 (z ~2.4 with the 10 ms floor), then 40 ms: one
    # stall, the first step is part of it
    monkeypatch.setattr(divergence, "PY_MAX_RANKS", path_limit)
    rank, _, since = first_flag(stall_world(4, 0.026, 0.04))
    assert (rank, since) == (2, 11)


def shift_world(n: int, seed: int, shift: float, onset_step: int = 30) -> list[StepValues]:
    rng = np.random.default_rng(seed)
    bad, rows = seed % n, []
    for step in range(1, onset_step + 10):
        v = 2.0 * (1 + 0.05 * rng.standard_normal(n))
        if step >= onset_step:
            v[bad] += shift * 0.1
        rows.append(StepValues("r", "loss", step, dict(enumerate(v.tolist())), n, True))
    return rows


def test_the_window_test_dates_a_large_shift_to_it_not_to_noise_in_its_window() -> None:
    # 16 ranks, seed 2: z 1.7 and 1.7 on steps 27-28 (the CUSUM's run ends at 29), then 50 from
    # step 30; the window test flags at 31 with those steps in its window (it dated it 27)
    rows = shift_world(16, 2, 50.0)
    assert first_flag(rows) == (2, 31, 30)


def test_a_large_shift_is_dated_to_its_onset_in_nearly_every_world() -> None:
    # 16 ranks, 50 sigma, 100 seeds: before, one flag in 11 was dated 1-3 steps early
    dates = [first_flag(shift_world(16, seed, 50.0))[2] for seed in range(100)]
    assert sum(d == 30 for d in dates) >= 97 and min(dates) >= 28


# loss of the 4-rank msrun job with corrupted labels on rank 2 from step 12 (recorded by the
# agent in tests/e2e/test_incidents_msrun.py, rounded to 4 digits)
LABELS = [
    [1.6196, 1.7072, 1.58, 1.6146], [1.5316, 1.6127, 1.5988, 1.6664],
    [1.601, 1.5381, 1.6369, 1.5613], [1.6287, 1.5971, 1.5653, 1.6289],
    [1.6077, 1.4765, 1.4212, 1.4761], [1.3835, 1.5465, 1.4429, 1.5122],
    [1.4329, 1.4908, 1.4801, 1.4467], [1.509, 1.3306, 1.4163, 1.3938],
    [1.3279, 1.3058, 1.3544, 1.4959], [1.3551, 1.3412, 1.4143, 1.3297],
    [1.2261, 1.3645, 1.3563, 1.4132], [1.4548, 1.2159, 1.8948, 1.1876],
    [1.1929, 1.2249, 1.8742, 1.2211], [1.1069, 1.1374, 2.0469, 1.2618],
    [1.028, 1.138, 1.7909, 1.2313], [1.121, 1.1316, 1.9697, 1.1338],
]  # fmt: skip


@pytest.mark.parametrize("path_limit", [128, 0], ids=["lists", "numpy"])
def test_real_corrupted_labels_are_dated_to_their_first_step(
    monkeypatch: pytest.MonkeyPatch, path_limit: int
) -> None:
    # step 12's z is only 2.8 (rank 0 was high that step), then 11.6, 7.4, 4.0: a shift that
    # varies, whose weak first step is its own
    monkeypatch.setattr(divergence, "PY_MAX_RANKS", path_limit)
    rows = [
        StepValues("r", "loss", i + 1, dict(enumerate(v)), 4, True) for i, v in enumerate(LABELS)
    ]
    assert first_flag(rows) == (2, 15, 12)
