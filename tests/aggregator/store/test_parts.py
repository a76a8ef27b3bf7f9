"""A flush's numpy columns (``parts.record_part``): the column-by-column paths for heartbeats
and events make the rows that a record at a time makes."""

from __future__ import annotations

import math

import numpy as np
from rankwatch.agent.wire.records import (
    EventRecord,
    Heartbeat,
    Record,
    StepRecord,
    TelemetryRecord,
)
from rankwatch.aggregator.store import parts
from rankwatch.aggregator.store.rows import BUFFERED, LAYOUT, NULL_CODE


def table_rows(part: parts.Part, name: str) -> list[str]:
    """A table's rows, codes as their names, sorted (row order means nothing in a part)."""
    cols = part.tables[name]
    out = []
    for i in range(len(cols["seq"])):
        row = []
        for col, kind in LAYOUT[name]:
            value = cols[col][i]
            if kind == "c":
                value = None if value == NULL_CODE else part.names[value]
            row.append(value.item() if isinstance(value, np.generic) else value)
        out.append(repr(row))  # repr: a NaN equals a NaN
    return sorted(out)


def one_at_a_time(records: list[Record]) -> parts.Part:
    cols: dict[str, list[list]] = {name: [[] for _ in LAYOUT[name]] for name in BUFFERED}
    for rec in records:
        parts._add_row(cols, rec)
    names: dict[str, int] = {}
    return parts.Part({n: parts.columns(n, c, names) for n, c in cols.items()}, list(names))


def mixed(ranks: int) -> list[Record]:
    records: list[Record] = []
    for rank in range(ranks):
        host, pid = f"node{rank // 8}", 100 + rank
        records += [
            EventRecord("r", rank, 1, 10.0 + rank, ranks, host, pid, "start", None,
                        {"launcher": "msrun", "n": math.nan, "argv": ["a", 1]}),
            Heartbeat("r", rank, 2, 11.0, None, 5.0, rank % 3),
            Heartbeat("r", rank, 3, 12.5, 4, math.inf, 0, paused="checkpoint", inc=1),
            EventRecord("other", rank, 4, 13.0, ranks, host, pid, "end", 7, {}),
        ]  # fmt: skip
    records += [
        StepRecord("r", 0, 5, 14.0, ranks, "node0", 100, 1, 0, {"loss": 0.5}),
        TelemetryRecord("r", 0, 6, 15.0, "node0", 100, "npu", "0", {"temp": 40.0}, {"model": "x"}),
    ]
    return records


def test_heartbeats_and_events_by_columns_make_the_rows_one_at_a_time_makes() -> None:
    records = mixed(50)
    got, want = parts.record_part(records), one_at_a_time(records)
    for name in BUFFERED:
        assert table_rows(got, name) == table_rows(want, name), name
    assert len(got.tables["heartbeats"]["seq"]) == 100
    assert len(got.tables["events"]["seq"]) == 100
    assert len(got.tables["recs"]["seq"]) == len(records)


def test_a_part_of_only_heartbeats_or_only_events() -> None:
    records = mixed(3)
    for kind in (Heartbeat, EventRecord):
        only = [r for r in records if type(r) is kind]
        got, want = parts.record_part(only), one_at_a_time(only)
        for name in BUFFERED:
            assert table_rows(got, name) == table_rows(want, name), (kind, name)
