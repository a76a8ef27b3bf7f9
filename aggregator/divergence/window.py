"""The window-sum test beside the CUSUM: a shift of a few sigma confirmed within a few steps.

Each scored step, each rank adds ``u = min(max(z - window_allowance, 0), cap)`` to its high
window (``-z`` to its low one); the test flags a rank when the sum of its ``u`` over the last
``window_steps`` steps reaches the limit ``h``, on a step that added to it, past the ratio
gate. ``cap`` is ``CAP_SHARE`` (0.4) of ``h``, so neither one step nor two, however far out,
flag alone: it takes three that stand out in one window (one-step spikes, even two in a window,
are noise; a 3 sigma shift rarely reaches the cap, so it costs its recall next to nothing).

Why beside the CUSUM: the CUSUM's allowance (1.5) and its clipped evidence make it slow on a
3 sigma shift (it flags within 5 steps 0.89 of what a test that knew the onset could, at
1,024 ranks); a sum over a fixed window of nearly the whole z is that very test at every step,
so together they reach 0.96 of it (docs/divergence.md). The CUSUM stays for shifts too small to
show within a window, which it adds up for as long as they last.

The limit is derived from the false-alarm budget, not tuned: for z ~ N(0, 1) the
distribution of ``u`` (a mass at 0, a truncated normal, a mass at ``cap``) is put on a grid,
each value rounded up to the next grid point, convolved ``window_steps`` times, and ``h`` is the
first grid point whose tail is at most ``DivergenceConfig.window_alpha(n)``. Rounding up
overstates every sum, so the limit errs toward fewer false flags. The z-scores are divided by
an estimate (the pooled scale), a few percent off for a while at a time, and a window's sum
is far out in its tail, where a 3 % smaller scale doubles the rate at 64 ranks: so the tail is
averaged over that estimate's error (``scale_error``) before the limit is read off it.

Pure: state lives in ``MetricState`` (``win_hi``/``win_lo``: the last ``window_steps - 1``
steps' ``u`` per rank, most recent first; ``win_steps``: their step numbers).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from rankwatch.aggregator.divergence import onset, ztail
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.state import MetricState

GRID = 0.005  # grid of the sum's distribution, in z units
CAP_SHARE = 0.4  # one step adds at most this share of the limit
_SQRT2 = math.sqrt(2.0)


def window_limit(cfg: DivergenceConfig, n: int) -> tuple[float, float]:
    """(h, cap) of the window test in a world of ``n`` ranks."""
    return _limit(cfg.window_steps, cfg.window_allowance, cfg.window_alpha(n), scale_error(cfg, n))


def scale_error(cfg: DivergenceConfig, n: int) -> float:
    """The relative standard deviation of the pooled scale (``ztail.scale_error``)."""
    return ztail.scale_error(cfg.spread_alpha, n)


@lru_cache(maxsize=256)
def _limit(steps: int, allowance: float, alpha: float, error: float) -> tuple[float, float]:
    cap, h = 20.0, math.inf
    for _ in range(12):  # h shrinks with cap and cap follows h: a few rounds settle it
        new_h = sum_tail_limit(steps, allowance, cap, alpha, error)
        if abs(new_h - h) < GRID:
            return new_h, cap
        h, cap = new_h, CAP_SHARE * new_h
    return h, cap


def step_pmf(allowance: float, cap: float, spread: float = 1.0) -> np.ndarray:
    """P(u in ((k - 1) GRID, k GRID]) at index k (index 0: u == 0), where
    u = min(max(spread * z - allowance, 0), cap) and z ~ N(0, 1)."""
    top = math.ceil(cap / GRID - 1e-9)
    edges = (np.minimum(np.arange(top + 1) * GRID, cap) + allowance) / spread
    cdf = np.array([0.5 * math.erfc(-x / _SQRT2) for x in edges.tolist()])
    pmf = np.empty(top + 1)
    pmf[0] = cdf[0]  # u == 0
    pmf[1:] = np.diff(cdf)
    pmf[top] += 0.5 * math.erfc(edges[-1] / _SQRT2)  # u == cap
    return pmf


def sum_tail(steps: int, allowance: float, cap: float, error: float = 0.0) -> np.ndarray:
    """P(sum of ``steps`` independent u >= k GRID) at index k. ``error``: the relative
    standard deviation of the scale the z-scores were divided by, the same for every step
    of a window (it moves slowly): the tail is averaged over it (Gauss-Hermite, 9 nodes)."""
    nodes, weights = _NODES if error else (np.zeros(1), np.ones(1))
    size = steps * math.ceil(cap / GRID - 1e-9) + 1
    fft = 1 << (size - 1).bit_length()
    tail = np.zeros(size)
    for g, w in zip(nodes.tolist(), weights.tolist(), strict=True):
        one = step_pmf(allowance, cap, 1.0 / max(1.0 + error * g, 0.5))
        pmf = np.fft.irfft(np.fft.rfft(one, fft) ** steps, fft)[:size]
        tail += w * np.cumsum(np.maximum(pmf, 0.0)[::-1])[::-1]  # smallest terms first
    return tail


def sum_tail_limit(
    steps: int, allowance: float, cap: float, alpha: float, error: float = 0.0
) -> float:
    """The smallest grid point h with P(sum of ``steps`` u >= h) <= alpha."""
    tail = sum_tail(steps, allowance, cap, error)
    return float(np.flatnonzero(tail <= alpha)[0]) * GRID


def _gauss_hermite(k: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite_e.hermegauss(k)
    return x, w / w.sum()


_NODES = _gauss_hermite(9)


Hit = tuple[int, str, int]  # (index into the step's ranks, direction, first step of the window)


def step_lists(
    cfg: DivergenceConfig,
    st: MetricState,
    step: int,
    ranks: list[int],
    z: list[float],
    rel: list[float],
    n: int,
    gate: tuple[float, float],
) -> list[Hit]:
    """Add this step to the windows (lists); a ``Hit`` for each rank whose window reached the
    limit on this step and is past the ratio gate ``gate`` (high, low) on average over the
    steps that added to it."""
    keep = cfg.window_steps - 1
    h, cap = window_limit(cfg, n)
    a, size, rule = cfg.window_allowance, st.size, st.rule.direction
    hits: list[Hit] = []
    live = False
    for direction, sign in (("high", 1.0), ("low", -1.0)):
        hi = direction == "high"
        rows, margins = (st.win_hi, st.gate_hi) if hi else (st.win_lo, st.gate_lo)
        if len(rows) != keep:
            rows[:] = [[0.0] * size for _ in range(keep)]
            margins[:] = [[0.0] * size for _ in range(keep)]
        new = [0.0] * size
        new_margin = [0.0] * size
        if rule in ("both", direction):
            bound = gate[0] if hi else gate[1]
            for i, (r, zi) in enumerate(zip(ranks, z, strict=True)):
                u = sign * zi - a
                if u > 0:
                    if u > cap:
                        u = cap
                    new[r] = u
                    m = new_margin[r] = _margin(rel[i], bound, hi)
                    total = u
                    for row in rows:
                        total += row[r]
                    if total >= h:
                        for row in margins:
                            m += row[r]
                        if m >= 0:
                            hits.append((i, direction, _since(cfg, st, rows, r, step, u)))
        rows.insert(0, new)
        rows.pop()
        margins.insert(0, new_margin)
        margins.pop()
        live = live or any(any(row) for row in rows)
    _push_step(st, step, keep)
    st.win_live = live
    return hits


def step_arrays(
    cfg: DivergenceConfig,
    st: MetricState,
    step: int,
    ranks: np.ndarray,
    z: np.ndarray,
    rel: np.ndarray,
    n: int,
    gate: tuple[float, float],
) -> list[Hit]:
    """``step_lists`` on numpy arrays: the same floats added in the same order."""
    keep = cfg.window_steps - 1
    h, cap = window_limit(cfg, n)
    a, rule = cfg.window_allowance, st.rule.direction
    hits: list[Hit] = []
    # every rank of the state, in order (a full step): rows are read as they are, not gathered
    every = ranks.size == st.size and bool((ranks == np.arange(st.size)).all())
    at: slice | np.ndarray = slice(None) if every else ranks
    for direction, signed in (("high", z), ("low", -z)):
        hi = direction == "high"
        rows, margins = (st.win_hi, st.gate_hi) if hi else (st.win_lo, st.gate_lo)
        if rows.shape != (keep, st.size):
            rows, margins = np.zeros((keep, st.size)), np.zeros((keep, st.size))
        new = np.zeros(st.size)
        new_margin = np.zeros(st.size)
        if rule in ("both", direction):
            u = signed - a
            pos = u > 0
            u = np.where(pos, np.minimum(u, cap), 0.0)
            total = u.copy()
            for row in rows:
                total += row[at]
            new[at] = u
            margin = np.where(pos, (rel - gate[0]) if hi else (gate[1] - rel), 0.0)
            new_margin[at] = margin
            reached = np.flatnonzero(pos & (total >= h))
            if reached.size:
                m = margin[reached]
                for row in margins:
                    m += row[ranks[reached]]
                for i in reached[m >= 0].tolist():
                    since = _since(cfg, st, rows, int(ranks[i]), step, float(u[i]))
                    hits.append((i, direction, since))
        rows[1:] = rows[:-1].copy()
        margins[1:] = margins[:-1].copy()
        if keep:
            rows[0] = new
            margins[0] = new_margin
        if hi:
            st.win_hi, st.gate_hi = rows, margins
        else:
            st.win_lo, st.gate_lo = rows, margins
    _push_step(st, step, keep)
    return hits


def _margin(rel: float, bound: float, high: bool) -> float:
    """How far ``rel`` is past the ratio gate ``bound`` (negative: inside it)."""
    return rel - bound if high else bound - rel


def _push_step(st: MetricState, step: int, keep: int) -> None:
    st.win_steps.insert(0, step)
    del st.win_steps[keep:]


def _since(cfg: DivergenceConfig, st: MetricState, rows: Any, rank: int, step: int,
           now: float) -> int:  # fmt: skip
    """Where ``rank``'s window began, before this step (addition ``now``) is pushed
    (``rows[j]``: the step ``st.win_steps[j]``): its first step that stood out by itself
    (addition past ``z_allowance - window_allowance``), or this step if none did; and if a
    later step reached ``z_threshold``, ``onset.since`` weighs the steps before that one as
    noise against the shift (each step's z taken as its addition plus the allowance, 0 where
    it added nothing), so a large shift is not dated to a step of noise in its window."""
    a = cfg.window_allowance
    past, high = cfg.z_allowance - a, cfg.z_threshold - a
    steps = [*reversed(st.win_steps), step]
    adds = [*(rows[age][rank] for age in range(len(st.win_steps) - 1, -1, -1)), now]
    first = next((i for i, u in enumerate(adds) if u > past), len(adds) - 1)
    out = next((i for i in range(first, len(adds)) if adds[i] >= high), None)
    if out is None or out == first:
        return steps[first]
    z = [u + a if u > 0 else 0.0 for u in adds[first:]]
    lead = z[: out - first]
    sums = (sum(z), sum(x * x for x in z), sum(lead), sum(x * x for x in lead))
    return onset.since(steps[first], steps[out], sums, step)


def mark_start(st: MetricState, direction: str, rank: int, since: int) -> None:
    """A window flag's divergence began where its window did, or where the CUSUM's run did
    if that is earlier."""
    if direction == "high":
        ev, start, out = st.ev_hi, st.start_hi, st.out_hi
    else:
        ev, start, out = st.ev_lo, st.start_lo, st.out_lo
    if not ev[rank] or since < start[rank]:
        start[rank] = since
        out[rank] = onset.NONE  # the run's sums start later: the window's date stands


__all__ = ["Hit", "mark_start", "step_arrays", "step_lists", "window_limit"]
