"""What reading a run's stored incidents costs when they list every rank of a big job.

    python bench/incident_reads.py [--ranks 4096,100000] [--updates 20] [--reads 15]

One run on a real store on disk: a cascade incident whose ``affected`` lists every rank but
the culprit, judged ``--updates`` times (a stored row each), beside a small one. Timed,
alternately in the same run, median ms over ``--reads``:

* before: the query and the JSON decode on every read (``incidents.read`` on a cursor);
* now: ``Store.incidents``, decoded once per flush that stored one of the run's judgements;
* after a flush: ``Store.incidents`` right after a flush stored a new judgement (a decode).

The page and `rankwatch status` read a run's incidents on every poll. The ratio is before / now.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwatch.aggregator.store import incidents as stored_incidents
from rankwatch.aggregator.store.db import Store

RUN = "big"


def incident(n: int, ranks: int, updated: float) -> dict[str, Any]:
    cascade = n == 1
    return {"id": f"{RUN}#{n}", "run": RUN, "cause": "nonfinite", "culprits": [7],
            "affected": [r for r in range(ranks) if r != 7] if cascade else [8, 9],
            "terminated": [], "opened": 1.0, "updated": updated, "resolved": None,
            "state": "firing", "summary": "rank 7: loss non-finite first", "basis": "earliest step",
            "timeline": [{"rank": 7, "step": 20, "what": "loss non-finite", "count": 1,
                          "ranks": []}], "step": 20, "evidence_count": 1}  # fmt: skip


def median_ms(fn: Callable[[], object], reads: int) -> float:
    times = []
    for _ in range(reads):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def ranks_arg(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """``--ranks``: sizes separated by commas, or the parser's usage error."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"--ranks takes numbers separated by commas, got {text!r}")


def one_size(ranks: int, updates: int, reads: int, folder: Path) -> tuple[float, float, float]:
    store = Store(folder / f"incidents-{ranks}.duckdb")
    try:
        for k in range(updates):
            store.append_incident(incident(1, ranks, 1.0 + k))
            store.append_incident(incident(2, ranks, 1.0 + k))
            store.flush()
        con = store._con.cursor()  # the read as before: a cursor of the store's connection

        def before() -> object:
            return stored_incidents.read(con, RUN)

        assert before() == store.incidents(RUN)  # the same incidents, either way
        old = median_ms(before, reads)
        now = median_ms(lambda: store.incidents(RUN), reads)
        flushed = []
        for k in range(reads):
            store.append_incident(incident(2, ranks, 100.0 + k))
            store.flush()
            flushed.append(median_ms(lambda: store.incidents(RUN), 1))
        con.close()
        return old, now, statistics.median(flushed)
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4096,100000", help="ranks of the job, comma-separated")
    parser.add_argument("--updates", type=int, default=20, help="stored judgements per incident")
    parser.add_argument("--reads", type=int, default=15)
    args = parser.parse_args()
    sizes = ranks_arg(parser, args.ranks)
    if any(n < 10 for n in sizes) or args.updates < 1 or args.reads < 1:
        print("incident_reads: --ranks of at least 10, --updates and --reads of at least 1",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"a run's stored incidents, {args.updates} judgements each, median of {args.reads}:")
    print(f"{'ranks':>8} {'before':>10} {'now':>10} {'ratio':>7} {'after a flush':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in sizes:
            old, now, flushed = one_size(ranks, args.updates, args.reads, Path(tmp))
            print(f"{ranks:>8} {old:>7.2f} ms {now:>7.3f} ms {old / now:>6.0f}x "
                  f"{flushed:>11.2f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
