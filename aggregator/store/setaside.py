"""Records the store could not write even alone: set aside as JSONL, never retried forever.

A flush narrows a refused batch down by halves (db.py); what still fails as one record or one
block is written here, one file per piece, in the agents' own JSONL format, so
``rankwatch import`` can bring it back once the cause is fixed. The store goes on with the
records after it, so one bad piece never keeps a data dir from storing anything again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rankwatch.agent.wire.records import Record, StepRecord, to_json_line, unblock
from rankwatch.aggregator.store.buffer import Batch
from rankwatch.aggregator.store.parts import Part

SET_ASIDE_DIR = "set_aside"  # beside the store file

log = logging.getLogger("rankwatch.store")


def set_aside(batch: Batch, store_dir: Path, exc: BaseException) -> Path | None:
    """Write ``batch``'s records to a new JSONL file under ``store_dir``; log where, and
    why. Returns the file, or None if it could not be written either (logged)."""
    records = [*unblock(batch.records), *(r for p in batch.parts for r in part_records(p))]
    folder = store_dir / SET_ASIDE_DIR
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S')}-{time.monotonic_ns()}.jsonl"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # a string DuckDB refused (a lone surrogate) is kept escaped rather than lost
        with path.open("x", encoding="utf-8", errors="backslashreplace") as out:
            out.writelines(map(to_json_line, records))
    except (OSError, ValueError, TypeError) as write_exc:
        log.error("rankwatch: %d records the store refused (%s) could not be set aside "
                  "either (%s)", len(records), exc, write_exc)  # fmt: skip
        return None
    log.error("rankwatch: the store refused %d records (%s); set aside in %s "
              "(`rankwatch import` takes them back); storing goes on", len(records), exc,
              path)  # fmt: skip
    return path


def part_records(part: Part) -> list[Record]:
    """The step records of a bulk part (``Batch.add_columns``: one ``recs`` row and one
    ``steps`` row per record)."""
    steps, recs, names = part.tables["steps"], part.tables["recs"], part.names
    return [
        StepRecord(names[run], int(rank), int(seq), float(t), int(ws), "", 0, int(step), None,
                   {names[metric]: float(value)})
        for run, rank, seq, t, step, metric, value, ws in zip(
            steps["run"], steps["rank"], steps["seq"], steps["time"], steps["step"],
            steps["metric"], steps["value"], recs["world_size"], strict=True,
        )
    ]  # fmt: skip
