"""What turning a stored run's host and state names into codes costs, the first step of its
rank table (``StoredRanks.of``), at 100,000 ranks.

    python bench/stored_ranks.py [--ranks 4096,100000] [--hosts-per 8] [--reads 15]

The columns are what ``Store.rank_columns`` returns (DuckDB's ``fetchnumpy``: object arrays,
NULLs masked) for a run of ``--ranks`` ranks on nodes of ``--hosts-per`` ranks, some without a
host, a third ended, with start, end and crash events. Timed alternately in the same run,
median ms over ``--reads``:

* before: the names sorted by ``np.unique`` over every rank's string (this bench's copy of the
  code it replaced);
* now: ``StoredRanks.of``, the distinct names found with a dict and only those sorted.

Both answers are checked equal. The ratio is before / now.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping

import duckdb
import numpy as np
from incident_reads import median_ms, ranks_arg
from rankwatch.aggregator.history import StoredRanks
from rankwatch.aggregator.snapshot import stored_rank_state


def rank_columns(ranks: int, hosts_per: int) -> dict[str, np.ndarray]:
    con = duckdb.connect()
    try:
        return con.sql(
            "SELECT i AS rank, CASE WHEN i % 997 = 0 THEN NULL ELSE 'node' || (i // $per) END"
            " AS host, i % 7 AS last_step, (i % 3 = 0) AS ended, 2.0 + i AS last_time,"
            " CASE WHEN i % 5 = 0 THEN NULL WHEN i % 5 = 1 THEN 'end' WHEN i % 5 = 2"
            " THEN 'crash' ELSE 'start' END AS life FROM range($n) r(i) ORDER BY i",
            params={"n": ranks, "per": hosts_per},
        ).fetchnumpy()
    finally:
        con.close()


def before(cols: Mapping[str, np.ndarray]) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    host = np.ma.filled(np.ma.asarray(cols["host"], dtype=object), "").astype(str)
    hosts, host_code = np.unique(host, return_inverse=True)
    life = np.ma.filled(np.ma.asarray(cols["life"], dtype=object), "").astype(str)
    ended = np.ma.filled(np.ma.asarray(cols["ended"], dtype=bool), False)
    lives, life_code = np.unique(np.where(ended, life, ""), return_inverse=True)
    names = [stored_rank_state(True, life or None) for life in lives.tolist()]
    states = sorted(set(names))
    remap = np.array([states.index(n) for n in names], dtype=np.int64)
    return hosts.tolist(), host_code.astype(np.int64), states, remap[life_code]


def one_size(ranks: int, hosts_per: int, reads: int) -> tuple[float, float]:
    cols = rank_columns(ranks, hosts_per)
    old = before(cols)
    now = StoredRanks.of(cols)
    same = (now.hosts, now.host.tolist(), now.states, now.state.tolist())
    if same != (old[0], old[1].tolist(), old[2], old[3].tolist()):
        raise SystemExit(f"stored_ranks: the codes differ from np.unique's at {ranks} ranks")
    olds, nows = [], []
    for _ in range(reads):  # alternately, so a change of the machine's load hits both
        olds.append(median_ms(lambda: before(cols), 1))
        nows.append(median_ms(lambda: StoredRanks.of(cols), 1))
    return statistics.median(olds), statistics.median(nows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4096,100000", help="ranks of the run, comma-separated")
    parser.add_argument("--hosts-per", type=int, default=8, help="ranks per node")
    parser.add_argument("--reads", type=int, default=15)
    args = parser.parse_args()
    sizes = ranks_arg(parser, args.ranks)
    if any(n < 1 for n in sizes) or args.hosts_per < 1 or args.reads < 1:
        parser.error("--ranks, --hosts-per and --reads take numbers of at least 1")
    print(f"a stored run's names into codes (StoredRanks.of), median of {args.reads}:")
    print(f"{'ranks':>8} {'before':>10} {'now':>10} {'ratio':>7}")
    for ranks in sizes:
        old, now = one_size(ranks, args.hosts_per, args.reads)
        print(f"{ranks:>8} {old:>7.2f} ms {now:>7.2f} ms {old / now:>6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
