"""The stored ranks of a run read in SQL with their final states' makings: each rank's summary
(``ranks``) beside its last start, end or crash event (``events``), as columns or counted.
A run of 100,000 ranks is one query either way, with no dict per rank."""

from __future__ import annotations

import duckdb
import numpy as np

# Each rank's last start, end or crash event, in the order ``events()`` lists them (the summary
# in ``ranks`` says only whether it ended the rank, not how).
_LIFE_SQL = (
    "SELECT rank, event AS life FROM events WHERE run = $run AND event IN ('start', 'end', "
    "'crash') QUALIFY row_number() OVER (PARTITION BY rank ORDER BY time DESC, seq DESC) = 1"
)


def rank_columns(cur: duckdb.DuckDBPyConnection, run: str) -> dict[str, np.ndarray]:
    return cur.sql(
        f"WITH life AS ({_LIFE_SQL}) SELECT r.rank, r.host, r.pid, r.world_size, r.first_time, "
        "r.last_time, r.records, r.last_step, r.ended, life.life FROM ranks r "
        "LEFT JOIN life ON life.rank = r.rank WHERE r.run = $run ORDER BY r.rank",
        params={"run": run},
    ).fetchnumpy()


def rank_lives(cur: duckdb.DuckDBPyConnection, run: str) -> list[tuple[bool, str | None, int]]:
    return cur.execute(
        f"WITH life AS ({_LIFE_SQL.replace('$run', '$1')}) SELECT r.ended, life.life, count(*) "
        "FROM ranks r LEFT JOIN life ON life.rank = r.rank WHERE r.run = $1 "
        "GROUP BY r.ended, life.life ORDER BY min(r.rank)",
        [run],
    ).fetchall()
