"""Every flushed (run, rank, inc, seq) as merged intervals, kept in memory (``SeenSeqs``).

Kept in the ``seqs`` table only, every flush read back the old intervals of each rank it
touched, merged them with its own in a window over both (gaps and islands) and deleted and
rewrote them: at thousands of ranks a good part of a flush's first statement
(docs/benchmarks.md). Here the merged intervals live in numpy columns and a flush merges its
spans into them (``merge``, the one definition of the rule). On disk ``seqs`` becomes a log: a
flush appends its own spans, merged among themselves, in its transaction, so a ``kill -9`` loses
nothing and a store opens by merging what the table holds (``load``). Overlapping rows are
folded away (the table rewritten merged, ``compact_due``) when it holds more than twice the
merged rows, and at close.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import duckdb
import numpy as np

COMPACT_MIN_ROWS = 100_000  # the log is rewritten merged no earlier than at this many rows

Key = tuple[str, int, int]  # run, rank, inc
Intervals = tuple[np.ndarray, np.ndarray, np.ndarray]  # key code, lo, hi (int64)


def merge(key: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Intervals:
    """The union of the inclusive intervals [lo, hi] of each key, as disjoint intervals that
    do not touch (seqs 1-3 and 4-6 are 1-6), sorted by (key, lo)."""
    key, lo, hi = (np.asarray(c, dtype=np.int64) for c in (key, lo, hi))
    if not len(key):
        return key, lo, hi
    order = np.lexsort((hi, lo, key))
    key, lo, hi = key[order], lo[order], hi[order]
    first = np.empty(len(key), dtype=bool)
    first[0], first[1:] = True, key[1:] != key[:-1]
    # the highest hi so far within each key: a running max over hi's ranks, each key's ranks
    # lifted above the keys' before it, so the max never carries over from one key to the next
    group = np.cumsum(first) - 1
    values, rank = np.unique(hi, return_inverse=True)
    lift = group * len(values)
    reach = values[np.maximum.accumulate(lift + rank.reshape(-1)) - lift]
    start = first.copy()
    start[1:] |= lo[1:] - 1 > reach[:-1]
    at = np.flatnonzero(start)
    return key[at], lo[at], np.maximum.reduceat(hi, at)


@dataclass(frozen=True, eq=False)
class SeenSeqs:
    """The merged intervals of every key as columns sorted by (key, lo); ``key`` codes a
    (run, rank, inc). A published snapshot is never changed: ``added`` makes the next."""

    codes: dict[Key, int] = field(default_factory=dict)  # shared by snapshots, only grows
    names: list[Key] = field(default_factory=list)  # code -> key, likewise
    cols: Intervals = (np.zeros(0, np.int64),) * 3
    logged: int = 0  # rows in the ``seqs`` table (its merged rows plus the flushes' since)

    def code(self, run: str, rank: int, inc: int) -> int:
        """The key's code, new ones numbered on (under the flush lock)."""
        got = self.codes.get((run, rank, inc))
        if got is None:
            got = self.codes[(run, rank, inc)] = len(self.names)
            self.names.append((run, rank, inc))
        return got

    def __len__(self) -> int:
        return len(self.cols[0])

    def added(self, new: Intervals, logged: int) -> SeenSeqs:
        """A snapshot with the intervals ``new`` merged in; ``logged``: the table's rows then."""
        touched = np.isin(self.cols[0], new[0])
        got = merge(*(np.concatenate([c[touched], n]) for c, n in zip(self.cols, new,
                                                                      strict=True)))  # fmt: skip
        cat = [np.concatenate([c[~touched], g]) for c, g in zip(self.cols, got, strict=True)]
        order = np.lexsort((cat[1], cat[0]))
        return SeenSeqs(self.codes, self.names, (cat[0][order], cat[1][order], cat[2][order]),
                        logged)  # fmt: skip

    def compact_due(self) -> bool:
        return self.logged > max(COMPACT_MIN_ROWS, 2 * len(self))

    def rows(self) -> list[tuple[str, int, int, int, int]]:
        """Every interval as (run, rank, inc, lo, hi), sorted."""
        names = self.names
        return sorted(
            (*names[k], lo, hi) for k, lo, hi in zip(*(c.tolist() for c in self.cols),
                                                      strict=True)
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeenSeqs):
            return NotImplemented
        return self.logged == other.logged and self.rows() == other.rows()

    __hash__ = None  # type: ignore[assignment]


def columns(
    seen: SeenSeqs, new: Intervals | None = None, names: list[str] | None = None
) -> dict[str, np.ndarray]:
    """``new`` (every interval if None) as the ``seqs`` table's columns, for a scan by name;
    with ``names``, run as an int32 code into them (``CODED_INSERT_SQL``): DuckDB reads an
    object column a Python string at a time (rows.py)."""
    key, lo, hi = seen.cols if new is None else new
    keys = [seen.names[k] for k in key.tolist()]
    if names is None:
        run = np.array([k[0] for k in keys], dtype=object)
    else:
        index = {name: i for i, name in enumerate(names)}
        run = np.array([index[k[0]] for k in keys], dtype=np.int32)
    return {
        "run": run,
        "rank": np.array([k[1] for k in keys], dtype=np.int64),
        "lo": lo.astype(np.int64),
        "hi": hi.astype(np.int64),
        "inc": np.array([k[2] for k in keys], dtype=np.int64),
    }


# the columns above (a table or a frame's numpy columns found by name) into the table
INSERT_SQL = "INSERT INTO seqs SELECT CAST(run AS VARCHAR), rank, lo, hi, inc FROM {src}"
CODED_INSERT_SQL = (
    "INSERT INTO seqs SELECT nm.names[run + 1], rank, lo, hi, inc FROM {src} CROSS JOIN "
    "(SELECT list(CAST(name AS VARCHAR) ORDER BY i) AS names FROM {names}) nm"
)


def compact_sql(src: str) -> list[str]:
    """The table rewritten as the merged intervals ``src`` holds (all of them)."""
    return ["DELETE FROM seqs", INSERT_SQL.format(src=src)]


def load(cur: duckdb.DuckDBPyConnection) -> SeenSeqs:
    """Every row of the ``seqs`` table, merged (rows of a store killed before it compacted
    overlap; a store an earlier version wrote holds them merged already)."""
    res = cur.execute("SELECT run, rank, inc, lo, hi FROM seqs").fetchnumpy()
    seen = SeenSeqs()
    code = seen.code
    key = np.array(
        [code(r, k, i) for r, k, i in zip(res["run"].tolist(), res["rank"].tolist(),
                                           res["inc"].tolist(), strict=True)], dtype=np.int64,
    )  # fmt: skip
    return SeenSeqs(seen.codes, seen.names, merge(key, res["lo"], res["hi"]), len(key))


def save(cur: duckdb.DuckDBPyConnection, seen: SeenSeqs) -> None:
    """Rewrite the table merged, in one transaction (at close)."""
    saved_seqs = columns(seen)  # found by name by DuckDB
    try:
        cur.execute(";\n".join(["BEGIN TRANSACTION", *compact_sql("saved_seqs"), "COMMIT"]))
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            cur.execute("ROLLBACK")
        raise
    del saved_seqs


def batch(seen: SeenSeqs, names: list[str], recs: dict[str, np.ndarray]) -> Intervals:
    """A flush's spans (its ``recs`` columns: run as a code into ``names``, rank, inc, seq..hi)
    merged among themselves, keyed by ``seen``'s codes (new keys numbered on)."""
    run, rank, inc = (np.asarray(recs[c], dtype=np.int64) for c in ("run", "rank", "inc"))
    order = np.lexsort((inc, rank, run))
    edge = np.empty(len(order), dtype=bool)
    edge[:1] = True
    edge[1:] = ((run[order][1:] != run[order][:-1]) | (rank[order][1:] != rank[order][:-1])
                | (inc[order][1:] != inc[order][:-1]))  # fmt: skip
    firsts = order[edge]
    codes = np.array([seen.code(names[r], k, i) for r, k, i in zip(
        run[firsts].tolist(), rank[firsts].tolist(), inc[firsts].tolist(), strict=True)],
        dtype=np.int64)  # fmt: skip
    key = np.empty(len(order), dtype=np.int64)
    key[order] = codes[np.cumsum(edge) - 1]
    return merge(key, recs["seq"], recs["hi"])
