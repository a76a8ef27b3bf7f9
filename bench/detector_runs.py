"""What a snapshot asks the divergence detector per live run, with many runs live at once.

    python bench/detector_runs.py [--runs 100,1000,10000] [--metrics 2] [--repeat 3]

A real ``DivergenceDetector`` holds ``--runs`` runs of one rank and ``--metrics`` metrics each
(a sweep of one-rank jobs, or many small jobs on one head node). Timed: one pass of what a
snapshot asks for every run (``listing`` and ``flagged_on`` of its rank), wall ms, median of
``--repeat``; "scan" is the same pass finding each run's states by walking every run's, as the
detector did before it kept them by run, timed in the same run (the baseline of the ratio).
"""

from __future__ import annotations

import argparse
import statistics
import time

from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.divergence.listing import list_active
from rankwatch.aggregator.merge import StepValues

METRICS = ("loss", "lr", "grad_norm", "throughput")


def scan_pass(det: DivergenceDetector, runs: list[str]) -> None:
    """Each run's listing and flagged metrics from a walk over every (run, metric) state."""
    for run in runs:
        states = [st for (r, _), st in det._states.items() if r == run]
        list_active(d for st in states for d in st.active.values())
        [st.active for (r, _), st in det._states.items() if r == run and st.active]


def kept_pass(det: DivergenceDetector, runs: list[str]) -> None:
    for run in runs:
        det.listing(run)
        det.flagged_on(run, [0])


def timed(fn: object, det: DivergenceDetector, runs: list[str], repeat: int) -> float:
    walls = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(det, runs)  # type: ignore[operator]
        walls.append((time.perf_counter() - t) * 1e3)
    return statistics.median(walls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="100,1000,10000", help="comma-separated counts")
    ap.add_argument("--metrics", type=int, default=2, choices=range(1, len(METRICS) + 1))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be 1 or more, got {args.repeat}")
    print(f"detector_runs: one pass of every run's listing and flagged_on, {args.metrics} "
          f"metrics per run; wall ms, median of {args.repeat}; scan: every run's states walked "
          "per run")  # fmt: skip
    print(f"{'runs':>8} {'scan_ms':>12} {'kept_ms':>12} {'ratio':>8}")
    for n in (int(x) for x in args.runs.split(",")):
        det = DivergenceDetector()
        runs = [f"run{i}" for i in range(n)]
        for run in runs:
            for metric in METRICS[: args.metrics]:
                det.update(StepValues(run, metric, 1, {0: 1.0}, 1, True))
        scan = timed(scan_pass, det, runs, args.repeat)
        kept = timed(kept_pass, det, runs, args.repeat)
        print(f"{n:>8,} {scan:>12.1f} {kept:>12.1f} {scan / max(kept, 1e-9):>7.1f}x")


if __name__ == "__main__":
    main()
