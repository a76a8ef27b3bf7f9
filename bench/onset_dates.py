"""How often a flag is dated to the step its fault began ("since step N"), beside the estimate
before ``aggregator/divergence/onset.py`` in the same run (no sockets).

    python bench/onset_dates.py [--ranks 4,16,1024] [--shifts 3,5,10,50] [--trials 400]
                                [--slopes 0.25,0.5]

Per world size and shift (in sigma of the ranks' noise: loss with 5 % relative per-rank noise,
one rank shifted from step ``ONSET``): of the trials flagged within ``WINDOW`` steps, the share
dated exactly to the onset, dated early, dated late, and the mean distance, for this tree and
for the baseline: the CUSUM's run start, and for the window test its first step past the
allowance (what both said before the likelihood estimate). Same values, same flags; only the
date differs. ``--slopes``: ramps (the shift grows from 0 by that many sigma a step), the mean
date after the ramp's start, now and baseline: a ramp is seen only once it is well under way.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from collections.abc import Iterator

import numpy as np
from rankwatch.aggregator.divergence import onset
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.merge import StepValues

ONSET = 30
WINDOW = 15


def first_date(n: int, shift: float, seed: int, slope: float = 0.0) -> int | None:
    """The flagged rank's date minus the onset, or None if not flagged within WINDOW steps;
    ``slope``: the shift grows by this many sigma a step from the onset instead (a ramp, given
    three times the steps)."""
    rng = np.random.default_rng(seed)
    det, bad = DivergenceDetector(), seed % n
    for step in range(1, ONSET + (3 * WINDOW if slope else WINDOW)):
        v = 2.0 * (1 + 0.05 * rng.standard_normal(n))
        if step >= ONSET:
            v[bad] += (slope * (step - ONSET + 1) if slope else shift) * 0.1
        res = det.update(StepValues("r", "loss", step, dict(enumerate(v.tolist())), n, True))
        for d in res.new:
            if d.rank == bad and d.kind == "outlier":
                return d.since_step - ONSET
    return None


@contextlib.contextmanager
def baseline() -> Iterator[None]:
    """The dates before the lead was weighed: the run's start, and the window's first step
    that stood out by itself (``window._since`` without ``onset.since``)."""
    since = onset.since
    onset.since = lambda start, *_: start  # type: ignore[assignment]
    try:
        yield
    finally:
        onset.since = since  # type: ignore[assignment]


def summary(dates: Counter[int]) -> str:
    total = sum(dates.values())
    if not total:
        return "nothing flagged"
    early = sum(c for d, c in dates.items() if d < 0) / total
    late = sum(c for d, c in dates.items() if d > 0) / total
    mean = sum(abs(d) * c for d, c in dates.items()) / total
    return (f"exact {dates[0] / total:.3f}  early {early:.3f}  late {late:.3f}  "
            f"mean off {mean:.2f} steps")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4,16,1024")
    ap.add_argument("--shifts", default="3,5,10,50")
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--slopes", default="0.25,0.5", help="ramps, sigma per step ('' for none)")
    args = ap.parse_args()
    for n in map(int, args.ranks.split(",")):
        for shift in map(float, args.shifts.split(",")):
            now, before = Counter[int](), Counter[int]()
            for seed in range(args.trials):
                for dates, ctx in ((now, contextlib.nullcontext()), (before, baseline())):
                    with ctx:
                        d = first_date(n, shift, seed)
                    if d is not None:
                        dates[d] += 1
            exact = (now[0] / max(1, before[0])) if before[0] else float("nan")
            flagged = sum(now.values())
            print(f"ranks {n:5d}  shift {shift:4g} sigma  flagged {flagged}/{args.trials}")
            print(f"    now:      {summary(now)}")
            print(f"    baseline: {summary(before)}")
            print(f"    exact dates, now / baseline: {exact:.2f}x")
        for slope in (float(x) for x in args.slopes.split(",") if x):
            means = []
            for ctx in (contextlib.nullcontext, baseline):
                dates = []
                for seed in range(args.trials):
                    with ctx():
                        d = first_date(n, 0.0, seed, slope)
                    if d is not None:
                        dates.append(d)
                means.append(sum(dates) / max(1, len(dates)))
            print(f"ranks {n:5d}  ramp {slope:g} sigma/step  mean date after its start: "
                  f"now {means[0]:+.2f}, baseline {means[1]:+.2f} steps")  # fmt: skip


if __name__ == "__main__":
    main()
