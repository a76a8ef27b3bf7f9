"""Scoring many steps at once (``update_many``) gives what scoring them one by one gives.

Pure, seeded. One detector scores each step with ``update``, another the same steps in chunks
with ``update_many``; every StepResult is compared field by field (floats through repr, so NaN
equals NaN), and so is every (run, metric) state afterwards.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from rankwatch.agent.wire.records import StepBlock
from rankwatch.aggregator.divergence.batch import block_columns, finite_columns
from rankwatch.aggregator.divergence.detector import (
    DivergenceDetector,
    QuietSteps,
    StepResult,
    expand,
)
from rankwatch.aggregator.divergence.lists import step_stats
from rankwatch.aggregator.merge import StepGrid, StepMerger, StepValues

from tests.aggregator.divergence.test_divergence_paths import dump, scenario


def state_dump(det: DivergenceDetector) -> list[tuple]:
    out = []
    for key, st in sorted(det._states.items()):
        per_rank = [list(map(repr, x)) for x in (st.ev_hi, st.ev_lo, st.own)]
        windows = (st.win_hi, st.win_lo, st.gate_hi, st.gate_lo)
        per_rank += [[list(map(repr, row)) for row in w] for w in windows]
        per_rank += [list(st.win_steps), st.win_live]
        out.append((key, repr(st.spread), st.spread_steps, st.last_step, st.calm, st.size,
                    per_rank, list(st.start_hi), list(st.start_lo), sorted(map(repr, st.active)),
                    sorted(st.clean.items())))  # fmt: skip
    return out


def by_metric(results: list[StepResult]) -> list[tuple]:
    """Dumps in step order per (run, metric): update_many gives one (run, metric) after the
    other, and the metrics of a run never influence each other."""
    return [dump(r) for r in sorted(results, key=lambda r: (r.stats.run, r.stats.metric))]


def both(svs: list[StepValues], chunk: int) -> tuple[list[tuple], list[tuple], tuple]:
    one, many = DivergenceDetector(), DivergenceDetector()
    a = by_metric([one.update(sv) for sv in svs])
    b = []
    for i in range(0, len(svs), chunk):
        b += expand(many.update_many(svs[i : i + chunk]))
    return a, by_metric(b), (state_dump(one), state_dump(many))


def interleaved(seed: int, metrics: int = 3) -> list[StepValues]:
    """Several metrics of one run, steps interleaved as the merger hands them out."""
    per_metric = [scenario(seed * 7 + m) for m in range(metrics)]
    svs = []
    for i in range(max(len(rows) for _, rows in per_metric)):
        for m, (_, rows) in enumerate(per_metric):
            if i < len(rows):
                step, row = rows[i]
                svs.append(StepValues("r", f"m{m}", step, dict(row), len(row), True))
    return svs


@pytest.mark.parametrize("seed", range(120))
def test_many_steps_at_once_score_as_one_by_one(seed: int) -> None:
    svs = interleaved(seed)
    for chunk in (len(svs), 7, 40):
        a, b, (st_a, st_b) = both(svs, chunk)
        assert a == b, f"seed {seed}, chunk {chunk}"
        assert st_a == st_b


def test_a_long_quiet_run_and_a_drift_take_the_batch_path_and_agree() -> None:
    rng = np.random.default_rng(0)
    svs = []
    for step in range(400):
        row = 2.0 + 0.02 * rng.standard_normal(8)
        if step >= 300:
            row[5] *= 1.6  # a drift: flagged within a few steps
        svs.append(StepValues("r", "loss", step, dict(enumerate(row.tolist())), 8, True))
    a, b, (st_a, st_b) = both(svs, 100)
    assert a == b and st_a == st_b
    det = DivergenceDetector()
    det.update_many(svs)
    assert [(d.rank, d.since_step) for d in det.active()] == [(5, 300)]
    assert any(new for _, _, new, _ in a)


def test_the_batch_path_is_taken_for_quiet_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet stretch is scored column-wise: update() sees only the steps it must."""
    svs = [
        StepValues("r", "loss", s, {r: 1.0 + 0.001 * ((r * 7 + s) % 5) for r in range(8)}, 8, True)
        for s in range(200)
    ]
    det = DivergenceDetector()
    seen = []
    real = det.update
    monkeypatch.setattr(det, "update", lambda sv: seen.append(sv.step) or real(sv))
    out = det.update_many(svs)
    assert len(seen) < 10, seen  # the first steps (no spread learned yet) at most
    quiet = [q for q in out if isinstance(q, QuietSteps)]
    assert len(quiet) == 1 and len(quiet[0]) == 200 - len(seen)
    assert quiet[0].steps == list(range(len(seen), 200))
    last = quiet[0].last_scores()
    assert dump(quiet[0].results()[-1])[1] == [(r, repr(last[r])) for r in range(8)]


def test_step_numbers_past_a_doubles_precision_still_take_the_batch_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps are compared as 64-bit ints: 2**62 + s are all different steps."""
    base = 2**62
    svs = [
        StepValues("r", "loss", base + s, {r: 1.0 + 0.001 * ((r * 7 + s) % 5) for r in range(8)},
                   8, True)
        for s in range(200)
    ]  # fmt: skip
    det = DivergenceDetector()
    seen = []
    real = det.update
    monkeypatch.setattr(det, "update", lambda sv: seen.append(sv.step) or real(sv))
    out = det.update_many(svs)
    assert len(seen) < 10, seen
    assert [s for q in out if isinstance(q, QuietSteps) for s in q.steps] == [
        sv.step for sv in svs if sv.step not in seen
    ]
    a, b, (st_a, st_b) = both(svs, 200)
    assert a == b and st_a == st_b


@pytest.mark.parametrize("n", [3, 4, 7, 8, 9, 15, 16, 17, 64, 128])
def test_block_statistics_are_step_stats_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    v = rng.standard_normal((300, n)) * 10 ** rng.uniform(-3, 3, (300, n))
    v[::3] = np.round(v[::3], 1)  # ties
    cols = [c.tolist() for c in block_columns(v)]
    for i, row in enumerate(v.tolist()):
        assert tuple(c[i] for c in cols) == step_stats(row)


@pytest.mark.parametrize("n", [3, 8, 9, 17])
def test_a_grids_metrics_at_once_have_each_metrics_statistics_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    grid = rng.standard_normal((50, n, 4)) * 10 ** rng.uniform(-3, 3, (50, n, 4))
    grid[5, 1, 2], grid[9, 0, 0] = math.nan, math.inf
    finite, cols = finite_columns(grid)
    for j in range(4):
        finite_j, cols_j = finite_columns(grid[:, :, j])
        assert finite[:, j].tolist() == finite_j.tolist()
        assert [c[:, j].tolist() for c in cols] == [c.tolist() for c in cols_j]
    assert not finite[5, 2] and not finite[9, 0] and finite.sum() == 50 * 4 - 2


def test_block_statistics_refuse_rows_longer_than_numpys_order_is_followed() -> None:
    with pytest.raises(ValueError, match="at most 128"):
        block_columns(np.ones((2, 129)))


def test_non_finite_steps_and_out_of_order_steps_go_one_by_one() -> None:
    rows = []
    for s in range(60):
        row = {r: 1.0 + 0.01 * random.Random(s * 10 + r).random() for r in range(6)}
        if s in (20, 21):
            row[2] = math.nan
        rows.append((s if s != 40 else 35, row))
    svs = [StepValues("r", "loss", s, row, 6, True) for s, row in rows]
    a, b, (st_a, st_b) = both(svs, 60)
    assert a == b and st_a == st_b
    assert any(new for _, _, new, _ in a)  # the NaN was flagged


@pytest.mark.parametrize("seed", range(12))
def test_grids_from_the_merger_score_as_their_step_values_one_by_one(seed: int) -> None:
    """What a round of batched frames completes (StepGrids, some StepValues) scores exactly as
    its StepValues do one at a time; a drift and a NaN on one rank are caught the same."""
    rng = np.random.default_rng(seed)
    merger, one, many = StepMerger(), DivergenceDetector(), DivergenceDetector()
    a: list[StepResult] = []
    b: list[StepResult] = []
    ranks = int(rng.integers(3, 10))
    for start in range(0, 300, 50):
        got = []
        for rank in range(ranks):
            steps = list(range(start, start + 50))
            loss = (2.0 + 0.02 * rng.standard_normal(50)) * np.where(
                (rank == 1) & (np.array(steps) >= 200), 1.5, 1.0
            )
            if seed % 3 == 0 and rank == 2:
                loss[7] = math.nan
            names = ("loss", "lr") if rank or seed % 4 else ("lr", "loss")  # one rank's order
            metrics = {"loss": loss.tolist(), "lr": [3e-4] * 50}
            blk = StepBlock("r", rank, ranks, "h", 1, [s + 1 for s in steps], [1e9] * 50,
                            steps, [None] * 50, {m: metrics[m] for m in names})  # fmt: skip
            got += merger.add_block(blk, 0.0)
        assert any(isinstance(g, StepGrid) for g in got) == bool(seed % 4)
        a += [
            one.update(sv)
            for g in got
            for sv in (g.step_values() if isinstance(g, StepGrid) else [g])
        ]
        b += expand(many.update_many(got))
    assert by_metric(a) == by_metric(b)
    assert state_dump(one) == state_dump(many)
    assert [(d.rank, d.since_step) for d in many.active() if d.kind == "outlier"] == [(1, 200)]
