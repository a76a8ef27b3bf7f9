"""Where a flagged rank's divergence began: the step a person is told ("since step N").

The CUSUM's own answer is the first step of its evidence run, the last step its evidence was
zero: the change point's estimate for the shift the CUSUM is tuned to (twice the allowance).
A much larger shift that follows a step of ordinary noise which happened to pass the allowance
is then dated to the noise step, one to three steps early (docs/divergence.md).

So each run also keeps the sum and the sum of squares of its z, its first step that stood out
by itself (z >= ``z_threshold``) and the two sums before that step. When the rank is flagged,
the steps before that one (the lead) are weighed as ordinary noise, z ~ N(0, 1), against the
shift that followed: a normal with the mean and the spread of the z after the lead, the spread
at least the noise's (a few steps say little about it), and only once the shift has been seen
on two steps (one says nothing of its spread). The onset moves to the step that stood out only
when the lead is likelier noise by ``MARGIN`` in log-likelihood. A real fault's z varies from
step to step (a 4-rank world's scale is noisy, a bad batch is worse than another), so its weak
first step is likelier the shift's than noise, where a step of 1.9 before steps of 50 is not.

Steps are counted by their numbers: a rank that skips steps within a run is rare, and only the
date depends on it.

State lives in ``MetricState``: ``run_*`` (rows: the run's sum, sum of squares, and both before
its first step past the threshold) and ``out_*`` (that step, ``NONE`` while none), per rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NONE = -1  # no step of the run has stood out by itself yet
MARGIN = 2.0  # log-likelihood the lead must be likelier noise by (bench/onset_dates.py)
SUM, SQUARES, LEAD_SUM, LEAD_SQUARES = range(4)  # the rows of ``run_*``


def note(run: Any, out: Any, rank: int, step: int, z: float, began: bool,
         threshold: float) -> None:  # fmt: skip
    """Add step ``step``'s signed ``z`` to ``rank``'s evidence run (lists: ``run`` is four
    lists, ``out`` one)."""
    total, squares = run[SUM], run[SQUARES]
    if began:
        out[rank] = NONE
        total[rank] = squares[rank] = 0.0
    if out[rank] == NONE and z >= threshold:
        out[rank] = step
        run[LEAD_SUM][rank] = total[rank]
        run[LEAD_SQUARES][rank] = squares[rank]
    total[rank] += z
    squares[rank] += z * z


def note_arrays(run: np.ndarray, out: np.ndarray, ranks: np.ndarray, step: int, z: np.ndarray,
                began: np.ndarray, threshold: float) -> None:  # fmt: skip
    """``note`` for every rank of ``ranks`` whose run goes on (``z``, ``began``: theirs;
    ``run``: a 4 x ranks array)."""
    sums = np.where(began, 0.0, run[:2, ranks])
    first = np.where(began, NONE, out[ranks])
    now = (first == NONE) & (z >= threshold)
    if now.any():
        run[2:, ranks[now]] = sums[:, now]
        first[now] = step
    out[ranks] = first
    sums[SUM] += z
    sums[SQUARES] += z * z
    run[:2, ranks] = sums


def since(start: int, out: int, sums: tuple[float, float, float, float], step: int) -> int:
    """The onset of a run that began at ``start`` and is flagged at ``step`` (``sums``: its
    ``run_*`` column)."""
    n_lead, n_after = out - start, step - out + 1
    if n_lead <= 0 or n_after < 2:
        return start  # no lead, or a shift seen on one step only: nothing to weigh it against
    total, squares, lead, lead_squares = sums
    after, after_squares = total - lead, squares - lead_squares
    mean = after / n_after
    var = max(1.0, (after_squares - after * mean) / (n_after - 1))
    noise = -lead_squares / 2
    shift = -(lead_squares - 2 * mean * lead + n_lead * mean * mean) / (2 * var)
    shift -= n_lead * math.log(var) / 2
    return out if noise > shift + MARGIN else start


__all__ = ["MARGIN", "NONE", "note", "note_arrays", "since"]
