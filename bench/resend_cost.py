"""What the resender's check costs when many ranks hold a gap no agent fills.

    python bench/resend_cost.py [--ranks 4096,100000] [--checks 40] [--moving 100]

Every rank of one run has lost one seq for good (the ranks are gone, or the records fell out
of their agents' buffers): each gap has been asked for ``RESEND_MAX_TRIES`` times and given up.
Then, per check (every ``RESEND_CHECK_S`` of a simulated clock), ``--moving`` ranks open a new
gap. Timed, alternately in the same run: the check as before (a sweep of every gapped
sequence, the ``before`` function below) and as now (``Resender``: the gaps that moved, the
ranks woken, the requests due). Median CPU ms per check, idle (no gap moving) and with
``--moving``, and the ratio before / now. The first size is the baseline of the ratios.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from rankwatch.aggregator.resend import RESEND_CHECK_S, RESEND_MAX_TRIES, RESEND_RETRY_S, Resender
from rankwatch.aggregator.seqs import SeqTracker

Asked = dict[tuple[str, int], tuple[tuple[int, int], int, float]]


def before(asked: Asked, health: Any, now: float, seqs: SeqTracker, request: Any) -> int:
    """The check before: every gapped sequence sorted, and its first gap looked up."""
    due = sorted(
        (run, rank, inc) for run, rank, inc in seqs.gapped() if rank in health.get(run, ())
    )
    keep = {(run, rank) for run, rank, _ in due}
    for key in [k for k in asked if k not in keep]:
        del asked[key]
    sent = 0
    for run, rank, inc in due:
        lo = seqs.gaps(run, rank, limit=1, inc=inc)[0][0]
        prev, tries, last = asked.get((run, rank), ((0, 0), 0, -math.inf))
        same = prev == (inc, lo)
        if same and (tries >= RESEND_MAX_TRIES or now - last < RESEND_RETRY_S):
            continue
        if request(run, rank, lo, inc):
            asked[(run, rank)] = ((inc, lo), tries + 1 if same else 1, now)
            sent += 1
    return sent


def _sent(run: str, rank: int, lo: int, inc: int) -> bool:
    return True


def _inc(run: str, rank: int) -> int:
    return 0


def measure(ranks: int, checks: int, moving: int) -> dict[str, float]:
    health = {"big": dict.fromkeys(range(ranks))}
    trackers = (SeqTracker(), SeqTracker())
    for seqs in trackers:
        for rank in range(ranks):
            seqs.accept("big", rank, 1)
            seqs.accept("big", rank, 3)
    asked: Asked = {}
    res = Resender()
    now_check: Callable[[float], int] = lambda t: res.request(  # noqa: E731
        health, t, trackers[1], _inc, _sent
    )
    old_check: Callable[[float], int] = lambda t: before(  # noqa: E731
        asked, health, t, trackers[0], _sent
    )
    t = 0.0
    while t <= RESEND_MAX_TRIES * RESEND_RETRY_S:  # every gap asked for, and given up
        now_check(t)
        old_check(t)
        t += RESEND_CHECK_S
    out: dict[str, float] = {}
    gap = 2  # the moving ranks' first missing seq
    for phase, n in (("idle", 0), ("moving", moving)):
        times: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(checks):
            t += RESEND_CHECK_S
            for seqs in trackers:  # the same ranks' first gap filled, a new one opened
                for rank in range(n):
                    seqs.accept("big", rank, gap)
                    seqs.accept("big", rank, gap + 3)
            gap += 2 if n else 0
            for name, fn in (("before", old_check), ("now", now_check)):
                cpu = time.process_time()
                fn(t)
                times[name].append((time.process_time() - cpu) * 1e3)
        for name, values in times.items():
            out[f"{phase} {name}"] = statistics.median(values)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="4096,100000")
    ap.add_argument("--checks", type=int, default=40)
    ap.add_argument("--moving", type=int, default=100)
    args = ap.parse_args()
    sizes = [int(s) for s in args.ranks.split(",")]
    if any(s < args.moving for s in sizes) or args.checks < 1:
        ap.error("every size needs at least --moving ranks, and --checks >= 1")
    print(f"resender check, every rank's gap given up; {args.moving} ranks' gaps moving")
    print(f"{'ranks':>8} {'idle before':>12} {'idle now':>10} {'ratio':>7}"
          f" {'moving before':>14} {'moving now':>11} {'ratio':>7}")  # fmt: skip
    for ranks in sizes:
        got = measure(ranks, args.checks, args.moving)
        idle = got["idle before"] / max(got["idle now"], 1e-6)
        mov = got["moving before"] / max(got["moving now"], 1e-6)
        idle_s = f"{got['idle before']:>9.2f} ms {got['idle now']:>7.3f} ms {idle:>6.0f}x"
        mov_s = f"{got['moving before']:>11.2f} ms {got['moving now']:>8.3f} ms {mov:>6.0f}x"
        print(f"{ranks:>8} {idle_s} {mov_s}")


if __name__ == "__main__":
    main()
