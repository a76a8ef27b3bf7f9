"""Decoding frames on the aggregator: a typed fast path in front of the wire schema's own
decoder (``agent/wire/records.py``, which stays the one definition of what is valid and of every
error).

msgspec decodes a frame of step records and heartbeats straight into typed structs. An agent's
batch (steps of one rank, one process, one metric set) is checked column by column and becomes
one ``StepBlock``. A relay's frame (steps of many ranks of one run, one per rank, one metric
set, heartbeats among them) is checked column by column too and becomes one ``RanksBlock`` of
its steps followed by its other records in order, when no rank's other record comes before
its step there (each rank's records then keep their order; ranks are merged by step and
health follows each rank on its own, so moving one rank's records past another's changes
nothing). Any other frame of them is checked record by record into the same records the
schema's decoder makes. Anything the fast path does not take exactly
(an event, an unknown field, a value out of range, a string where a number goes, bad msgpack)
goes to ``records.decode_frame_blocks``, which accepts it or raises the ``DecodeError`` it always
did. So a frame decodes to the same records either way; only the cost differs
(bench/ingest.py ``--stages``).

Unknown fields are refused by the fast path, not skipped: the schema's decoder rejects a frame
holding binary values or map keys that are not strings anywhere, also in fields it ignores, and
msgspec would skip such a field unread. Events take the schema's path for the same reason
(``info`` is free-form).
"""

from __future__ import annotations

from operator import attrgetter
from typing import cast, final

import msgspec
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import (
    MAX_FRAME_BYTES,
    MAX_METRICS,
    MAX_NAME_CHARS,
    MAX_RANK,
    SCHEMA_VERSION,
    Heartbeat,
    RanksBlock,
    Record,
    StepBlock,
    StepRecord,
)

_INT64_END = 2**63
Item = Record | StepBlock | RanksBlock


@final  # so that ``type(r) is _Step`` (the hot loops) narrows for the type checker
class _Step(msgspec.Struct, tag_field="kind", tag="step", forbid_unknown_fields=True):
    """A step record as the agent writes it. msgspec checks the types (bool is not an int;
    an int is taken for a float field and converted, as the schema's decoder does)."""

    run: str
    rank: int
    seq: int
    time: float
    world_size: int
    host: str
    pid: int
    step: int
    epoch: int | None
    metrics: dict[str, float]
    inc: int = 0


@final
class _Beat(msgspec.Struct, tag_field="kind", tag="heartbeat", forbid_unknown_fields=True):
    run: str
    rank: int
    seq: int
    time: float
    next_in: float
    dropped: int
    last_step: int | None = None
    paused: str | None = None
    inc: int = 0


class _Frame(msgspec.Struct, forbid_unknown_fields=True):
    v: int
    records: list[_Step | _Beat]


_decode = msgspec.msgpack.Decoder(_Frame).decode
_same = attrgetter("run", "rank", "world_size", "host", "pid", "inc")
_columns = attrgetter("seq", "time", "step", "epoch")
_metrics = attrgetter("metrics")
_rank = attrgetter("rank")
_run_size = attrgetter("run", "world_size")
_ranks_columns = attrgetter("seq", "time", "host", "pid", "step", "epoch", "inc")


def decode_frame_blocks(frame: bytes) -> list[Record | StepBlock]:
    """``records.decode_frame_blocks``, faster for frames of steps and heartbeats; the same
    result."""
    out = decode_fast(frame)
    return records.decode_frame_blocks(frame) if out is None else out


def decode_fast(frame: bytes) -> list[Record | StepBlock] | None:
    """What the fast path makes of ``frame``; None where it leaves it to the schema's decoder."""
    items = _typed(frame)
    if items is None:
        return None
    block = _step_block(items) if len(items) >= 2 else None
    return [block] if block is not None else _records(items)


def decode_ranks(frame: bytes) -> list[Item] | None:
    """``decode_fast``, with a relay's frame of many ranks' steps as one ``RanksBlock``
    followed by the frame's other records (the module docstring): the same records, each
    rank's in its order."""
    items = _typed(frame)
    if items is None:
        return None
    block = _step_block(items) if len(items) >= 2 else None
    if block is not None:
        return [block]
    ranks = _ranks_block(items) if len(items) >= 2 else None
    return ranks if ranks is not None else cast("list[Item] | None", _records(items))


def decode_frame_ranks(frame: bytes) -> list[Item]:
    """``decode_frame_blocks`` with ``decode_ranks``'s blocks (what the receiver takes)."""
    out = decode_ranks(frame)
    return cast("list[Item]", records.decode_frame_blocks(frame)) if out is None else out


def _typed(frame: bytes) -> list[_Step | _Beat] | None:
    if len(frame) > MAX_FRAME_BYTES:
        return None
    try:
        envelope = _decode(frame)
    except Exception:  # any failure: the schema's decoder says what is wrong, if anything
        return None
    return envelope.records if 1 <= envelope.v <= SCHEMA_VERSION else None


def _step_block(steps: list[_Step | _Beat]) -> StepBlock | None:
    """The records as one StepBlock (what ``records.decode_frame_blocks`` makes of them), or
    None when they are not all valid steps of one rank, process and metric set."""
    first = steps[0]
    if type(first) is not _Step or steps[-1].rank != first.rank:  # a relay's frame: fail fast
        return None
    if set(map(type, steps)) != {_Step}:
        return None
    if set(map(_same, steps)) != {_same(first)}:
        return None
    run, rank, world_size, host, pid, inc = _same(first)
    if not (
        0 < len(run) <= MAX_NAME_CHARS
        and 0 <= inc < _INT64_END
        and 0 <= rank <= MAX_RANK
        and 1 <= world_size < _INT64_END
        and len(host) <= MAX_NAME_CHARS
        and 0 <= pid < _INT64_END
    ):
        return None
    seq, time_, step, epoch = zip(*map(_columns, steps), strict=True)
    # msgpack ints reach 2**64 - 1: the schema's are 64-bit signed
    if min(seq) < 1 or max(seq) >= _INT64_END or max(step) >= _INT64_END:
        return None
    if any(e is not None and e >= _INT64_END for e in epoch):
        return None
    values = _values(first.metrics, list(map(_metrics, steps)))
    if values is None:
        return None
    return StepBlock(
        run, rank, world_size, host, pid, list(seq), list(time_), list(step), list(epoch), values,
        inc,
    )  # fmt: skip


def _ranks_block(items: list[_Step | _Beat]) -> list[Item] | None:
    """The steps as one RanksBlock, then the other records (checked one by one), or None when
    they are not valid steps of distinct ranks of one run with one world size and one metric
    set, or when a rank's other record comes before its step."""
    steps = [r for r in items if type(r) is _Step]
    if len(steps) < 2:
        return None
    first = steps[0]
    run, world_size = first.run, first.world_size
    ranks = list(map(_rank, steps))
    if len(set(ranks)) != len(ranks) or set(map(_run_size, steps)) != {(run, world_size)}:
        return None
    seq, time_, hosts, pids, step, epoch, incs = map(
        list, zip(*map(_ranks_columns, steps), strict=True)
    )
    # msgpack ints reach 2**64 - 1: the schema's are 64-bit signed
    if not (
        0 < len(run) <= MAX_NAME_CHARS
        and 1 <= world_size < _INT64_END
        and min(ranks) >= 0
        and max(ranks) <= MAX_RANK
        and min(seq) >= 1
        and max(seq) < _INT64_END
        and max(step) < _INT64_END
        and min(pids) >= 0
        and max(pids) < _INT64_END
        and min(incs) >= 0
        and max(incs) < _INT64_END
        and max(map(len, hosts)) <= MAX_NAME_CHARS
        and all(e is None or e < _INT64_END for e in epoch)
    ):
        return None
    values = _values(first.metrics, list(map(_metrics, steps)))
    if values is None:
        return None
    block = RanksBlock(run, world_size, ranks, seq, time_, hosts, pids, step, epoch, values, incs)
    if len(steps) == len(items):
        return [block]
    before: set[int] = set()  # ranks of the run with a record that is no step so far
    for r in items:
        if type(r) is not _Step:
            if r.run == run:
                before.add(r.rank)
        elif r.rank in before:
            return None  # that rank's step would move ahead of its earlier record
    others = _records([r for r in items if type(r) is not _Step])
    return None if others is None else [block, *others]


def _records(items: list[_Step | _Beat]) -> list[Record | StepBlock] | None:
    """The records one by one (no block among them), or None when one of them is not valid as
    it is."""
    out: list[Record | StepBlock] = []
    append = out.append
    for r in items:
        if not (
            0 < len(r.run) <= MAX_NAME_CHARS
            and 0 <= r.rank <= MAX_RANK
            and 1 <= r.seq < _INT64_END
            and 0 <= r.inc < _INT64_END
        ):
            return None
        if type(r) is _Step:
            metrics = r.metrics
            if not (
                1 <= r.world_size < _INT64_END
                and len(r.host) <= MAX_NAME_CHARS
                and 0 <= r.pid < _INT64_END
                and r.step < _INT64_END
                and (r.epoch is None or r.epoch < _INT64_END)
                and len(metrics) <= MAX_METRICS
                and all(0 < len(name) <= MAX_NAME_CHARS for name in metrics)
            ):
                return None
            append(StepRecord(
                r.run, r.rank, r.seq, r.time, r.world_size, r.host, r.pid, r.step, r.epoch,
                metrics, r.inc,
            ))  # fmt: skip
        else:
            last = r.last_step
            if not (0 <= r.dropped < _INT64_END and (last is None or last < _INT64_END)):
                return None
            append(Heartbeat(
                r.run, r.rank, r.seq, r.time, last, r.next_in, r.dropped, r.paused, r.inc
            ))  # fmt: skip
    return out


def _values(first: dict[str, float], maps: list[dict[str, float]]) -> dict[str, list[float]] | None:
    """Metric name -> one value per record, when every record has the first one's names."""
    names = tuple(first)
    if len(names) > MAX_METRICS or not all(0 < len(name) <= MAX_NAME_CHARS for name in names):
        return None
    return records.metric_columns(names, maps)
