"""Step statistics of a small world on plain Python lists, bit for bit what numpy gives.

Why: numpy has a fixed cost per call whatever the size, and a scored step makes ~50 calls, so
at 8 ranks the fixed cost dwarfs the arithmetic (docs/benchmarks.md). The divergence
detector scores worlds whose ranks are all below its ``PY_MAX_RANKS`` with these functions
and larger ones with numpy; both give the same floats (the tests compare them), so a world's
verdicts do not depend on which path scored it.

Exactness: ``quantiles`` follows ``np.percentile(method="linear")`` step by step (virtual index,
floor, gamma, numpy's two-sided lerp), ``np_sum`` follows numpy's pairwise summation for
up to ``PAIRWISE_BLOCK`` values (eight accumulators, then the tail), which is how ``mean`` adds.
"""

from __future__ import annotations

import math
from typing import Any

PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: below this its pairwise sum is one unrolled block
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)  # percentiles 5..95 / 100, as numpy divides them

# n -> per quantile (lower index, upper index, gamma); the same for every step of a world.
_plans: dict[int, list[tuple[int, int, float]]] = {}


def quantile_plan(n: int) -> list[tuple[int, int, float]]:
    plan = []
    for q in QUANTILES:
        virtual = (n - 1) * q
        if virtual >= n - 1:  # numpy points both neighbours at the last value (index -1)
            plan.append((n - 1, n - 1, virtual + 1.0))
        else:
            lower = math.floor(virtual)
            plan.append((lower, lower + 1, virtual - lower))
    _plans[n] = plan
    return plan


def plan_for(n: int) -> list[tuple[int, int, float]]:
    """``quantile_plan(n)``, computed once per world size."""
    return _plans.get(n) or quantile_plan(n)


def quantiles(s: list[float]) -> list[float]:
    """p5, p25, p50, p75, p95 of the sorted, non-empty ``s``, as ``np.percentile`` computes."""
    return quantiles_at(plan_for(len(s)), s)


def quantiles_at(plan: list[tuple[int, int, float]], s: Any) -> list[float]:
    """``quantiles`` from the order statistics ``s[i]`` that ``plan`` reads (a sorted list, or
    a mapping of just those positions)."""
    out = []
    for lo, hi, gamma in plan:
        a, b = s[lo], s[hi]
        diff = b - a
        out.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    return out


def np_sum(v: list[float]) -> float:
    """``np.add.reduce`` of up to ``PAIRWISE_BLOCK`` float64 values, in numpy's order."""
    n = len(v)
    if n < 8:
        total = 0.0
        for x in v:
            total += x
        return total
    if n > PAIRWISE_BLOCK:
        raise ValueError(f"np_sum follows numpy's order for <= {PAIRWISE_BLOCK} values, got {n}")
    whole = n - n % 8
    r0, r1, r2, r3, r4, r5, r6, r7 = v[:8]
    for i in range(8, whole, 8):
        r0 += v[i]
        r1 += v[i + 1]
        r2 += v[i + 2]
        r3 += v[i + 3]
        r4 += v[i + 4]
        r5 += v[i + 5]
        r6 += v[i + 6]
        r7 += v[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(whole, n):
        total += v[i]
    return total


def step_stats(v: list[float]) -> tuple[float, ...]:
    """(median, mad, mean, min, max, p5, p25, p75, p95) of the finite, non-empty ``v``."""
    n = len(v)
    s = sorted(v)
    p5, p25, med, p75, p95 = quantiles(s)
    dev = sorted([abs(x - med) for x in s])
    half = n >> 1
    mad = dev[half] if n & 1 else (dev[half - 1] + dev[half]) / 2
    return med, mad, np_sum(v) / n, s[0], s[-1], p5, p25, p75, p95


def no_outliers(n: int) -> tuple[bool, ...]:
    """(False,) * n, shared: most steps have no outlier (a tuple: never written to)."""
    out = _NO_OUTLIERS.get(n)
    if out is None:
        out = _NO_OUTLIERS[n] = (False,) * n
    return out


_NO_OUTLIERS: dict[int, tuple[bool, ...]] = {}


def rel_list(v: list[float], med: float) -> list[float]:
    """rel per finite value: x / median, or for a pair leave-one-out (x / the other rank)."""
    if len(v) == 2:
        a, b = v
        return [pair_rel(a, b), pair_rel(b, a)]
    absmed = abs(med)
    if absmed > 0:
        return [1.0 + (x - med) / absmed for x in v]
    return [1.0 if x == 0 else math.copysign(math.inf, x) for x in v]


def pair_rel(x: float, other: float) -> float:
    if other != 0:
        return x / other
    return 1.0 if x == 0 else math.inf
