"""Buffered records as numpy columns per buffered table (``rows.LAYOUT``): a ``Part``, and the
builders that make one in bulk from records and blocks (step records and blocks column by
column, events, heartbeats and telemetry row by row). The write buffer (``buffer.py``) holds
what waits for the flush; the flush registers a ``Part``'s columns with DuckDB."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any, cast

import numpy as np
from rankwatch.agent.wire.records import (
    EventRecord,
    Heartbeat,
    RanksBlock,
    Record,
    StepBlock,
    StepRecord,
    TelemetryRecord,
)
from rankwatch.aggregator.store.rows import BUFFERED, DTYPE, LAYOUT, NULL_CODE, NULL_INT


def columns(
    name: str, cols: Sequence[Sequence[Any]], names: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Python column lists -> numpy arrays DuckDB can scan (see NULL_INT); strings of "c"
    columns get their code in ``names`` (added when new)."""
    out: dict[str, np.ndarray] = {}
    for (col, kind), values in zip(LAYOUT[name], cols, strict=True):
        if kind == "c":  # int32 codes (DTYPE["c"]) already
            out[col] = _codes(list(values), {} if names is None else names)
        elif kind == "n":
            out[col] = np.asarray([NULL_INT if v is None else v for v in values], dtype=DTYPE[kind])
        else:
            out[col] = np.asarray(values, dtype=DTYPE[kind])
    return out


def _code(value: str | None, names: dict[str, int]) -> int:
    return NULL_CODE if value is None else names.setdefault(value, len(names))


def _codes(values: list[Any], names: dict[str, int]) -> np.ndarray:
    """Codes of a column of names: one hash per value, no Python call per value."""
    uniq = set(values)
    if len(uniq) == 1:
        return np.full(len(values), _code(next(iter(uniq)), names), np.int32)
    lookup = {v: _code(v, names) for v in uniq}
    return np.fromiter(map(lookup.__getitem__, values), np.int32, len(values))


def _nullable(values: list[int | None]) -> np.ndarray:
    nulls = values.count(None)
    if nulls == len(values):
        return np.full(len(values), NULL_INT, np.int64)
    if nulls:
        values = [NULL_INT if v is None else v for v in values]
    return np.array(values, dtype=np.int64)


@dataclass
class Part:
    """Buffered rows as numpy columns per table (LAYOUT), "c" columns coded into ``names``."""

    tables: dict[str, dict[str, np.ndarray]]
    names: list[str]

    @property
    def rows(self) -> int:
        return sum(len(cols["seq"]) for cols in self.tables.values())

    @classmethod
    def empty(cls) -> Part:
        return cls({n: columns(n, [[]] * len(LAYOUT[n])) for n in BUFFERED}, [])

    @classmethod
    def merge(cls, parts: Sequence[Part]) -> Part:
        """One part holding all of ``parts`` in order (codes renumbered into one table)."""
        if len(parts) == 1:
            return parts[0]
        index: dict[str, int] = {}
        remaps = [
            np.array([*(index.setdefault(s, len(index)) for s in p.names), NULL_CODE], np.int32)
            for p in parts
        ]  # remap[-1] keeps NULL_CODE
        tables = {
            name: {
                col: np.concatenate(
                    [
                        remap[p.tables[name][col]] if kind == "c" else p.tables[name][col]
                        for p, remap in zip(parts, remaps, strict=True)
                    ]
                )
                for col, kind in LAYOUT[name]
            }
            for name in BUFFERED
        }
        return cls(tables, list(index))


Item = Record | StepBlock | RanksBlock


_NO_METRICS = {None: math.nan}  # a step record without metrics still gets a row, so it is stored
_STEP_FIELDS = attrgetter("run", "rank", "seq", "time", "world_size", "host", "pid", "step",
                          "epoch")  # fmt: skip
_INC = attrgetter("inc")


def record_part(items: Sequence[Item]) -> Part:
    """Records and blocks -> numpy columns per buffered table: step records and blocks (the
    bulk) column by column, without a Python call per record; events and heartbeats row by
    row."""
    names: dict[str, int] = {}
    steps = [r for r in items if type(r) is StepRecord]
    blocks = [r for r in items if type(r) is StepBlock] if len(steps) < len(items) else []
    ranks = (
        [r for r in items if type(r) is RanksBlock] if len(steps) + len(blocks) < len(items) else []
    )
    others = (
        cast(list[Record], [r for r in items if type(r) not in _BULK])
        if len(steps) + len(blocks) + len(ranks) < len(items)
        else []
    )
    cols: dict[str, list[list]] = {name: [[] for _ in LAYOUT[name]] for name in BUFFERED}
    # a heartbeat per rank every few seconds, and a job's start (or end) an event per rank:
    # at thousands of ranks, column by column too
    beats = [r for r in others if type(r) is Heartbeat]
    events = [r for r in others if type(r) is EventRecord]
    if beats:
        _add_heartbeats(cols, beats)
    if events:
        _add_events(cols, events)
    rest = [r for r in others if type(r) not in _COLUMNAR] if beats or events else others
    for rec in rest:
        _add_row(cols, rec)
    tables = {name: columns(name, c, names) for name, c in cols.items()}
    for made in (_step_tables(steps, names) if steps else None,
                 _block_tables(blocks, names) if blocks else None,
                 _ranks_tables(ranks, names) if ranks else None):  # fmt: skip
        if made is not None:
            tables["recs"] = _concat(tables["recs"], made[0])
            tables["steps"] = _concat(tables["steps"], made[1])
    return Part(tables, list(names))


def _step_tables(
    steps: list[StepRecord], names: dict[str, int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``recs`` and ``steps`` columns of step records: one row per (record, metric)."""
    n = len(steps)
    fields = zip(*map(_STEP_FIELDS, steps), strict=True)
    run, rank, seq, t, ws, host, pid, step, epoch = map(list, fields)
    head = {"run": _codes(run, names), "rank": np.array(rank, np.int64),
            "seq": np.array(seq, np.int64), "time": np.array(t, np.float64)}  # fmt: skip
    step_col = np.array(step, np.int64)
    recs = {**head, "kind": np.full(n, _code("step", names), np.int32),
            "world_size": np.array(ws, np.int64), "host": _codes(host, names),
            "pid": np.array(pid, np.int64), "step": step_col,
            "event": np.full(n, NULL_CODE, np.int32), "hi": head["seq"],
            "n": np.ones(n, np.int64), "last_time": head["time"],
            "inc": np.fromiter(map(_INC, steps), np.int64, n)}  # fmt: skip
    per = [r.metrics or _NO_METRICS for r in steps]
    counts = np.fromiter(map(len, per), np.int64, n)
    # one repeat count for all when every record has as many metrics (the usual case)
    reps: int | np.ndarray = int(counts[0]) if (counts == counts[0]).all() else counts
    rows = {c: np.repeat(v, reps) for c, v in (*head.items(), ("step", step_col),
                                                  ("epoch", _nullable(epoch)),
                                                  ("inc", recs["inc"]))}  # fmt: skip
    total = int(counts.sum())
    rows["metric"] = _codes([k for m in per for k in m], names)
    rows["value"] = np.fromiter(chain.from_iterable(m.values() for m in per), np.float64, total)
    return recs, rows


def _block_tables(
    blocks: list[StepBlock], names: dict[str, int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``recs`` and ``steps`` columns of step blocks, from their lists in bulk: a block of n
    records and k metrics gives k x n step rows, metric after metric (one row per record with
    metric NULL when k = 0, like a StepRecord without metrics)."""
    lens = np.fromiter(map(len, blocks), np.int64, len(blocks))
    n = int(lens.sum())

    def per_block(values: list[Any], dtype: Any) -> np.ndarray:
        return np.repeat(np.array(values, dtype), lens)

    recs = {
        "run": per_block([_code(b.run, names) for b in blocks], np.int32),
        "rank": per_block([b.rank for b in blocks], np.int64),
        "seq": np.fromiter(chain.from_iterable(b.seq for b in blocks), np.int64, n),
        "time": np.fromiter(chain.from_iterable(b.time for b in blocks), np.float64, n),
        "kind": np.full(n, _code("step", names), np.int32),
        "world_size": per_block([b.world_size for b in blocks], np.int64),
        "host": per_block([_code(b.host, names) for b in blocks], np.int32),
        "pid": per_block([b.pid for b in blocks], np.int64),
        "step": np.fromiter(chain.from_iterable(b.step for b in blocks), np.int64, n),
        "event": np.full(n, NULL_CODE, np.int32),
        "inc": per_block([b.inc for b in blocks], np.int64),
    }
    epoch = _nullable(list(chain.from_iterable(b.epoch for b in blocks)))
    # row -> record: block j's rows are k_j passes over its records
    ks = np.array([max(1, len(b.metrics)) for b in blocks], np.int64)
    if (lens == n // len(blocks)).all() and (ks == ks[0]).all() and len(blocks) > 1:
        width, k = int(lens[0]), int(ks[0])  # the usual case: blocks of one shape
        ridx = (np.arange(len(blocks) * k) // k * width)[:, None] + np.arange(width)
        ridx = ridx.ravel()
    else:
        per_rows = lens * ks
        blk = np.repeat(np.arange(len(blocks)), per_rows)
        pos = np.arange(int(per_rows.sum())) - np.repeat(np.cumsum(per_rows) - per_rows, per_rows)
        ridx = np.repeat(np.cumsum(lens) - lens, per_rows) + pos % np.maximum(lens[blk], 1)
    metric_codes = [
        code for b in blocks for code in ([_code(m, names) for m in b.metrics] or [NULL_CODE])
    ]
    values = chain.from_iterable(
        (b.metrics.values() if b.metrics else ([math.nan] * len(b),)) for b in blocks
    )
    rows = {c: recs[c][ridx] for c in ("run", "rank", "seq", "step", "inc")}
    rows["epoch"] = epoch[ridx]
    rows["time"] = recs["time"][ridx]
    rows["metric"] = np.repeat(np.array(metric_codes, np.int32), np.repeat(lens, ks))
    rows["value"] = np.fromiter(chain.from_iterable(values), np.float64, len(ridx))
    return _spans(recs, lens), {c: rows[c] for c, _ in LAYOUT["steps"]}


_BULK = (StepRecord, StepBlock, RanksBlock)


def _ranks_tables(
    blocks: list[RanksBlock], names: dict[str, int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``recs`` and ``steps`` columns of RanksBlocks, as their records would give: a
    ``recs`` row per record (each rank its own span) and k step rows per record of k metrics
    (one with metric NULL when k = 0)."""
    lens = np.fromiter(map(len, blocks), np.int64, len(blocks))
    n = int(lens.sum())

    def joined(column: str, dtype: Any) -> np.ndarray:
        return np.fromiter(chain.from_iterable(getattr(b, column) for b in blocks), dtype, n)

    seq, t = joined("seq", np.int64), joined("time", np.float64)
    recs = {
        "run": np.repeat(np.array([_code(b.run, names) for b in blocks], np.int32), lens),
        "rank": joined("ranks", np.int64), "seq": seq, "time": t,
        "kind": np.full(n, _code("step", names), np.int32),
        "world_size": np.repeat(np.array([b.world_size for b in blocks], np.int64), lens),
        "host": _codes(list(chain.from_iterable(b.hosts for b in blocks)), names),
        "pid": joined("pids", np.int64), "step": joined("step", np.int64),
        "event": np.full(n, NULL_CODE, np.int32), "hi": seq, "n": np.ones(n, np.int64),
        "last_time": t, "inc": joined("incs", np.int64),
    }  # fmt: skip
    epoch = _nullable(list(chain.from_iterable(b.epoch for b in blocks)))
    # record after record, each record's metrics in turn (as StepRecords are laid out)
    ks = np.array([max(1, len(b.metrics)) for b in blocks], np.int64)
    per_record = np.repeat(ks, lens)
    ridx = np.repeat(np.arange(n), per_record)
    metric_codes = [
        np.tile(np.array([_code(m, names) for m in b.metrics] or [NULL_CODE], np.int32), len(b))
        for b in blocks
    ]
    values = chain.from_iterable(
        chain.from_iterable(zip(*b.metrics.values(), strict=True))
        if b.metrics
        else [math.nan] * len(b)
        for b in blocks
    )
    rows = {c: recs[c][ridx] for c in ("run", "rank", "seq", "step", "inc", "time")}
    rows["epoch"] = epoch[ridx]
    rows["metric"] = np.concatenate(metric_codes)
    rows["value"] = np.fromiter(values, np.float64, len(ridx))
    return recs, {c: rows[c] for c, _ in LAYOUT["steps"]}


def _spans(recs: dict[str, np.ndarray], lens: np.ndarray) -> dict[str, np.ndarray]:
    """``recs`` rows (one per record of blocks of ``lens`` records) as span rows: a block whose
    seqs go up by one is one row; the records of any other block stay rows of their own.
    The flush's bookkeeping then reads a row per block instead of per record."""
    seq = recs["seq"]
    lens = lens[lens > 0]
    if not len(lens):
        return {**recs, "hi": seq, "n": np.ones(0, np.int64), "last_time": recs["time"]}
    start = np.cumsum(lens) - lens
    end = start + lens - 1
    steady = np.concatenate([[0], np.cumsum(np.diff(seq) == 1)])  # consecutive pairs so far
    whole = steady[end] - steady[start] == lens - 1
    out = {c: v[start] for c, v in recs.items()}
    # as DuckDB's min() and max() of the records would be: NaN sorts above every number
    out["time"] = np.fmin.reduceat(recs["time"], start)
    out["last_time"] = np.maximum.reduceat(recs["time"], start)
    out["step"] = np.maximum.reduceat(recs["step"], start)
    out["hi"], out["n"] = seq[end], lens
    out = {c: v[whole] for c, v in out.items()}
    if whole.all():
        return out
    own = np.repeat(~whole, lens)  # records of blocks that are not one span
    single = {c: v[own] for c, v in recs.items()}
    single.update(hi=single["seq"], n=np.ones(len(single["seq"]), np.int64),
                  last_time=single["time"])  # fmt: skip
    return {c: np.concatenate([out[c], single[c]]) for c in out}


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not len(a["seq"]):
        return b
    return {c: np.concatenate([a[c], b[c]]) for c in a}


def _add_row(c: dict[str, list[list]], rec: Record) -> None:
    head = (rec.run, rec.rank, rec.seq, rec.time)
    span = (rec.seq, 1, rec.time)  # a span of one record
    if isinstance(rec, EventRecord):
        ident = (rec.world_size, rec.host, rec.pid)
        _push(c["recs"], (*head, "event", *ident, 0, rec.event, *span, rec.inc))
        info = json.dumps(dict(rec.info), default=str)
        _push(c["events"], (*head, *ident, rec.event, rec.step, info, rec.inc))
    elif isinstance(rec, TelemetryRecord):
        # no world_size: a sample says nothing of the rank's identity (rank_meta, ranks)
        _push(c["recs"], (*head, "telemetry", None, None, None, 0, None, *span, rec.inc))
        where = (rec.source, rec.device)
        for key, number in rec.values.items():
            _push(c["telemetry"], (*head, *where, key, number, rec.inc))
        for key, text in (*rec.labels.items(), ("host", rec.host)):
            _push(c["telemetry_labels"], (*head, *where, key, text, rec.inc))
    elif isinstance(rec, Heartbeat):
        _push(c["recs"], (*head, "heartbeat", None, None, None, 0, None, *span, rec.inc))
        _push(c["heartbeats"], (*head, rec.last_step, rec.next_in, rec.dropped, rec.paused,
                                rec.inc))  # fmt: skip
    else:  # a StepRecord subclass
        _push(c["recs"], (*head, "step", rec.world_size, rec.host, rec.pid, rec.step, None,
                          *span, rec.inc))  # fmt: skip
        for name, value in (rec.metrics or _NO_METRICS).items():
            _push(c["steps"], (*head[:3], rec.step, rec.epoch, rec.time, name, value, rec.inc))


_BEAT_FIELDS = attrgetter("run", "rank", "seq", "time", "last_step", "next_in", "dropped",
                          "paused", "inc")  # fmt: skip


def _add_heartbeats(c: dict[str, list[list]], beats: list[Heartbeat]) -> None:
    """``_add_row`` of each of ``beats``, column by column (the rows of a table may come in
    any order: every read sorts or aggregates)."""
    run, rank, seq, time, last_step, next_in, dropped, paused, inc = zip(
        *map(_BEAT_FIELDS, beats), strict=True
    )
    n = len(beats)
    none = (None,) * n
    recs = (run, rank, seq, time, ("heartbeat",) * n, none, none, none, (0,) * n, none, seq,
            (1,) * n, time, inc)  # fmt: skip
    for col, values in zip(c["recs"], recs, strict=True):
        col.extend(values)
    beat = (run, rank, seq, time, last_step, next_in, dropped, paused, inc)
    for col, values in zip(c["heartbeats"], beat, strict=True):
        col.extend(values)


_EVENT_FIELDS = attrgetter("run", "rank", "seq", "time", "world_size", "host", "pid", "event",
                           "step", "info", "inc")  # fmt: skip
_COLUMNAR = (Heartbeat, EventRecord)


def _add_events(c: dict[str, list[list]], events: list[EventRecord]) -> None:
    """``_add_row`` of each of ``events``, column by column."""
    run, rank, seq, time, world_size, host, pid, event, step, info, inc = zip(
        *map(_EVENT_FIELDS, events), strict=True
    )
    n = len(events)
    recs = (run, rank, seq, time, ("event",) * n, world_size, host, pid, (0,) * n, event, seq,
            (1,) * n, time, inc)  # fmt: skip
    for col, values in zip(c["recs"], recs, strict=True):
        col.extend(values)
    text = tuple(json.dumps(dict(i), default=str) for i in info)
    row = (run, rank, seq, time, world_size, host, pid, event, step, text, inc)
    for col, values in zip(c["events"], row, strict=True):
        col.extend(values)


def _push(cols: list[list], values: tuple) -> None:
    for col, value in zip(cols, values, strict=True):
        col.append(value)
