"""The wire schema: the one module the aggregator imports from the agent.

A *frame* is one ZeroMQ message: a msgpack map ``{"v": SCHEMA_VERSION, "records": [record, ...]}``.
A frame may carry a batch of records. A *record* is a msgpack/JSON map with these common fields:

====== ======= ===============================================================
field  type    meaning
====== ======= ===============================================================
kind   str     ``"step"``, ``"event"``, ``"heartbeat"`` or ``"telemetry"``
run    str     run name, shared by all ranks of one launch
rank   int     global rank, ``0 <= rank``
seq    int     per-rank sequence number, increasing across all kinds from 1
time   float   wall-clock time (Unix seconds) when the record was made
inc    int     optional: the agent's incarnation (see below); absent means 0
====== ======= ===============================================================

Seqs count within one *incarnation* of a rank: a process (and its JSONL file) with its own
random ``inc`` (``1 <= inc < MAX_INC``, exact as a JSON number in any reader). A process that
restarts and finds its rank's JSONL file continues that file's seqs and keeps its ``inc``; one
that restarts without it (another log dir, node or container, an unwritable dir) starts again
at seq 1 under a new ``inc``. The aggregator dedupes on (run, rank, inc, seq) and records a
``restart`` event (``AGGREGATOR_EVENTS``: made by the aggregator, never sent by an agent, with
``seq`` 0) when a new incarnation of a known rank starts logging steps. ``inc`` is optional, so
schema version 1 still holds both ways: an agent that sends none (an older one) is incarnation
0, and an older aggregator ignores the field (and dedupes a restart's records away, as it did).

``step`` adds ``world_size`` (int), ``host`` (str), ``pid`` (int), ``step`` (int), ``epoch``
(int or None) and ``metrics`` (map of metric name -> float; NaN and ±Inf allowed).

``event`` adds ``event`` (one of ``EVENT_KINDS``: start, end, crash, eval, note, pause, resume,
command: a rank's acknowledgement of a command, ``commands.Ack.info()`` its info),
``step`` (int or None) and ``info`` (map: launcher info for start, ``reason`` for end,
``exc_type``/``message``/``traceback`` for crash, ``seconds``/``reason`` for pause, anything for
eval and note). Events also carry ``world_size``, ``host`` and ``pid``.

``heartbeat`` adds ``last_step`` (int or None), ``next_in`` (seconds until the next heartbeat is
due; during an announced pause, until the pause ends), ``dropped`` (records the agent could not
queue for sending, total) and optionally ``paused`` (reason of an announced pause, or None)
and ``stack`` (where the main thread is while the rank has not stepped for long: the map of
``stacks.StackSample.as_dict``, at most ``stacks.MAX_FRAMES`` frames, names clipped to
``stacks.FILE_MAX`` / ``stacks.FUNC_MAX``; or None, the usual case). A ``stack`` this decoder
cannot read does not cost the heartbeat: it is dropped and ``Heartbeat.stack_problem`` says why
(``refused: ...``); one over the limits is cut down to them (``truncated: ...``). An aggregator
from before ``stack`` ignores the field like any unknown one: its fast msgspec path refuses the
frame (unknown field) and the schema decoder below takes the heartbeat without it.

``telemetry`` (schema version 2) is one source's sample of hardware or host state, time-indexed
rather than step-indexed: ``host`` (str), ``pid`` (int), ``source`` (``"host"``, ``"npu"``,
``"gpu"``, ``"memory"`` or a user source's name; at most ``MAX_SOURCE_CHARS``), ``device`` (``""``
for host-wide values, else ``"npu:<physical id>"``, ``"gpu:<index>"``, ``"cpu"``; at most
``MAX_SOURCE_CHARS``), ``values`` (map of ``<source>/<key>`` -> float, as a step's ``metrics``:
NaN and ±Inf allowed, at most ``MAX_METRICS``) and ``labels`` (map of name -> short text such as
``npu/health`` = ``"Warning"``; at most ``MAX_LABELS`` of at most ``MAX_LABEL_CHARS`` chars). Its
``seq`` comes from the rank's one counter, so dedupe and resend treat it like any record.

Schema version 2 only adds ``telemetry``. A frame (or JSONL line) is written with ``"v": 2`` only
when it carries a telemetry record; every other one keeps ``"v": BASE_VERSION`` (1), so an
aggregator of version 1 goes on taking a newer agent's steps, events and heartbeats and refuses
only its telemetry frames, with its message naming the newer version. Agents put telemetry in
frames of their own (``frame_groups``). This decoder reads versions 1 and 2.

Unknown fields are ignored, so newer agents can talk to older aggregators within one schema
version. A missing or mistyped required field raises ``DecodeError`` naming the field.

JSONL (the agent's local fallback and ``rankwatch import``) holds one record per line in the
same shape plus ``"v"``. JSON (RFC 8259) has no NaN or Infinity, so non-finite metric values are
written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``; ``decode_record`` turns them
back into floats, so a record round-trips exactly.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, final

import msgpack

from .jsonsafe import JSON_TO_NONFINITE, json_safe, json_value
from .stacks import StackSample, truncation

SCHEMA_VERSION = 2  # the newest version this module reads and writes (2: telemetry records)
BASE_VERSION = 1  # the version of frames and lines holding no telemetry record
MAX_FRAME_BYTES = 4 * 1024 * 1024  # aggregator's ZMQ_MAXMSGSIZE; agents batch below this
MAX_NAME_CHARS = 256  # run and metric names longer than this are rejected
MAX_METRICS = 1024  # metrics in one step record
MAX_RANK = 2**31 - 1  # the store keys ranks as 32-bit ints
MAX_INFO_DEPTH = 32  # nesting of maps/lists in event info (agents send at most 4)
# The smallest valid record in msgpack (a heartbeat of a one-character run, every number an
# int of one byte): a frame claiming more records than its bytes can hold is refused unread.
MIN_RECORD_BYTES = 57
MAX_FRAME_RECORDS = MAX_FRAME_BYTES // MIN_RECORD_BYTES
# Below this many records a frame is cheap to decode whatever it holds, and each bad record
# gets its own error (which field is wrong) rather than the frame's.
COUNT_CHECK_RECORDS = 64
MAX_SOURCE_CHARS = 64  # a telemetry record's source and device names
MAX_LABELS = 32  # labels in one telemetry record
MAX_LABEL_CHARS = 256  # one label's text
MAX_INC = 2**53  # agents pick their incarnation below this (exact in a JavaScript number)
_INT64_END = 2**63  # ints are 64-bit signed on the wire and in the store


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of the step record: its name, its type on the wire, whether it must be there."""

    name: str
    type: Any
    required: bool = True


# The step record's fields, defined once. The decoders below read them from here; the
# encoders on the hot paths (the Monitor's JSON template, the sender's wire maps, msgspec's
# struct in aggregator/ingest/frames.py) are written out for speed and checked against this
# in tests/agent/test_schema.py.
STEP_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("run", str), FieldSpec("rank", int), FieldSpec("seq", int),
    FieldSpec("time", float), FieldSpec("world_size", int), FieldSpec("host", str),
    FieldSpec("pid", int), FieldSpec("step", int), FieldSpec("epoch", int | None),
    FieldSpec("metrics", dict[str, float]), FieldSpec("inc", int, required=False),
)  # fmt: skip
_STEP_FIELDS = tuple(f.name for f in STEP_FIELDS if f.required)

KINDS = ("step", "event", "heartbeat", "telemetry")
EVENT_KINDS = ("start", "end", "crash", "eval", "note", "pause", "resume", "command")
AGGREGATOR_EVENTS = ("restart",)  # events the aggregator records itself (in the store and feed)


class DecodeError(ValueError):
    """A frame or record that does not follow the schema.

    ``reason`` is a short stable key for counters (``msgpack``, ``envelope``, ``version``,
    ``field``, ``size``, ``records``: a frame whose records cannot be real, refused as a
    whole); the message says what exactly was wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StepRecord:
    run: str
    rank: int
    seq: int
    time: float
    world_size: int
    host: str
    pid: int
    step: int
    epoch: int | None
    metrics: Mapping[str, float]
    inc: int = 0
    kind: str = field(default="step", init=False)


@dataclass(frozen=True, slots=True)
class EventRecord:
    run: str
    rank: int
    seq: int
    time: float
    world_size: int
    host: str
    pid: int
    event: str
    step: int | None
    info: Mapping[str, Any]
    inc: int = 0
    kind: str = field(default="event", init=False)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    run: str
    rank: int
    seq: int
    time: float
    last_step: int | None
    next_in: float
    dropped: int
    paused: str | None = None
    inc: int = 0
    stack: StackSample | None = None
    # Why a received ``stack`` was dropped or cut (for the aggregator's counters); never sent.
    stack_problem: str = ""
    kind: str = field(default="heartbeat", init=False)


@dataclass(frozen=True, slots=True)
class TelemetryRecord:
    run: str
    rank: int
    seq: int
    time: float  # when the sample was taken
    host: str
    pid: int
    source: str
    device: str
    values: Mapping[str, float]
    labels: Mapping[str, str]
    inc: int = 0
    kind: str = field(default="telemetry", init=False)


Record = StepRecord | EventRecord | Heartbeat | TelemetryRecord


@final  # so that the hot paths' ``type(x) is StepBlock`` checks narrow for the type checker
@dataclass(slots=True)
class StepBlock:
    """Consecutive step records of one rank, column-wise: what an agent's batched frame holds
    in the usual case (one run, rank and process, the same metric names in every record).

    ``decode_frame_blocks`` returns one for such a frame, so the aggregator can dedupe, merge,
    score and store a whole frame with a few calls instead of one per record. ``records()``
    gives the same records one by one. Columns hold one entry per record, in frame order.
    """

    run: str
    rank: int
    world_size: int
    host: str
    pid: int
    seq: list[int]
    time: list[float]
    step: list[int]
    epoch: list[int | None]
    metrics: dict[str, list[float]]  # metric name -> one value per record
    inc: int = 0

    def __len__(self) -> int:
        return len(self.seq)

    def record(self, i: int) -> StepRecord:
        """Record ``i`` (negative counts from the end) as a StepRecord."""
        metrics = {name: values[i] for name, values in self.metrics.items()}
        return StepRecord(
            self.run, self.rank, self.seq[i], self.time[i], self.world_size, self.host,
            self.pid, self.step[i], self.epoch[i], metrics, self.inc,
        )  # fmt: skip

    def records(self) -> list[StepRecord]:
        return [self.record(i) for i in range(len(self.seq))]


@final
@dataclass(slots=True)
class RanksBlock:
    """Step records of one run from distinct ranks, one record per rank, column-wise: what a
    relay's frame holds in the usual case (a node's ranks at a step, the same metric names
    in every record). The aggregator's fast decoder makes one of such a frame, so dedupe,
    health, merge and the store take a frame of many ranks whole, as ``StepBlock`` does a
    frame of one rank. ``records()`` gives the same records one by one, in frame order.

    Identity columns are plural (``ranks``, ``hosts``, ``pids``, ``incs``) so that code
    reading ``.rank`` of a record fails on a block instead of reading a list."""

    run: str
    world_size: int
    ranks: list[int]
    seq: list[int]
    time: list[float]
    hosts: list[str]
    pids: list[int]
    step: list[int]
    epoch: list[int | None]
    metrics: dict[str, list[float]]  # metric name -> one value per record
    incs: list[int]

    def __len__(self) -> int:
        return len(self.seq)

    def record(self, i: int) -> StepRecord:
        metrics = {name: values[i] for name, values in self.metrics.items()}
        return StepRecord(
            self.run, self.ranks[i], self.seq[i], self.time[i], self.world_size, self.hosts[i],
            self.pids[i], self.step[i], self.epoch[i], metrics, self.incs[i],
        )  # fmt: skip

    def records(self) -> list[StepRecord]:
        return [self.record(i) for i in range(len(self.seq))]

    def check(self) -> None:
        """Raise ValueError unless every column has one entry per record and the ranks are
        distinct (what the code taking a block whole relies on)."""
        n = len(self.seq)
        columns: dict[str, Sequence[Any]] = {
            "ranks": self.ranks, "time": self.time, "hosts": self.hosts, "pids": self.pids,
            "step": self.step, "epoch": self.epoch, "incs": self.incs,
        }  # fmt: skip
        columns.update((f"metric {m!r}", v) for m, v in self.metrics.items())
        for name, column in columns.items():
            if len(column) != n:
                raise ValueError(
                    f"RanksBlock of run {self.run!r}: column {name} has {len(column)} entries "
                    f"for {n} records"
                )
        if len(set(self.ranks)) != n:
            raise ValueError(f"RanksBlock of run {self.run!r}: a rank appears twice")


Block = StepBlock | RanksBlock


def to_wire(record: Record) -> dict[str, Any]:
    """The record as a plain map (msgpack-ready; NaN stays a float). Incarnation 0 (an agent
    without one) is left out, as such an agent writes it."""
    out: dict[str, Any] = {"kind": record.kind}
    for name in record.__slots__:
        if name != "kind":
            value = getattr(record, name)
            out[name] = dict(value) if isinstance(value, Mapping) else value
    if not out["inc"]:
        del out["inc"]
    if "stack_problem" in out:  # a heartbeat's
        del out["stack_problem"]
        stack = out.pop("stack")
        if stack is not None:
            out["stack"] = stack.as_dict()
    return out


def encode_frame(records: list[Record] | list[dict[str, Any]]) -> bytes:
    """One ZeroMQ message carrying ``records`` (dataclasses or already-wire maps), with the
    lowest schema version that holds them (``version_of``)."""
    wire = [r if isinstance(r, dict) else to_wire(r) for r in records]
    return msgpack.packb({"v": version_of(wire), "records": wire}, use_bin_type=True)


def version_of(wire: Sequence[dict[str, Any]]) -> int:
    """The schema version a frame of these wire maps is written with: 2 when one of them is
    a telemetry record, else ``BASE_VERSION``, which aggregators of version 1 still read."""
    for item in wire:
        if item.get("kind") == "telemetry":
            return SCHEMA_VERSION
    return BASE_VERSION


def frame_groups(wire: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``wire`` as the batches to send as separate frames: its telemetry records apart from
    the rest, so an aggregator of version 1 refuses only the telemetry. Order is kept within
    each batch (the aggregator dedupes on seqs, not on arrival order)."""
    telemetry = [item for item in wire if item.get("kind") == "telemetry"]
    if not telemetry:
        return [wire]
    rest = [item for item in wire if item.get("kind") != "telemetry"]
    return [rest, telemetry] if rest else [telemetry]


def decode_frame(frame: bytes) -> list[Record]:
    """Decode and validate one frame; raises ``DecodeError`` on the first problem."""
    # The maps came out of this frame: the records may keep them (no copy of metrics).
    return [_step_fast(r, copy=False) or _decode_checked(r) for r in frame_maps(frame)]


def decode_frame_blocks(frame: bytes) -> list[Record | StepBlock]:
    """``decode_frame``, with a frame of two or more step records of one rank, one process
    and one metric set returned as a single ``StepBlock`` (the agent's usual batch). Anything
    else decodes as ``decode_frame`` does; the checks and errors are the same."""
    return decode_maps_blocks(frame_maps(frame))


def decode_maps_blocks(raws: list[Any]) -> list[Record | StepBlock]:
    """``decode_frame_blocks`` of the record maps ``frame_maps`` gave."""
    if len(raws) >= 2:
        block = _step_block(raws)
        if block is not None:
            return [block]
    return [_step_fast(r, copy=False) or _decode_checked(r) for r in raws]


def unblock(items: Sequence[Record | StepBlock | RanksBlock]) -> list[Record]:
    """``items`` with every StepBlock and RanksBlock replaced by its records, in order."""
    return [
        r
        for item in items
        for r in (item.records() if isinstance(item, (StepBlock, RanksBlock)) else (item,))
    ]


def frame_maps(frame: bytes) -> list[Any]:
    """The envelope of a frame checked (size, msgpack, map, version, the records' count and
    shape): its record maps, each to be decoded on its own."""
    return frame_envelope(frame)[1]


def frame_envelope(frame: bytes) -> tuple[int, list[Any]]:
    """``frame_maps``, with the frame's schema version."""
    if len(frame) > MAX_FRAME_BYTES:
        raise DecodeError("size", f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    _check_count(frame)
    try:
        envelope = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError("msgpack", f"not a msgpack frame: {exc}") from None
    if not isinstance(envelope, dict):
        raise DecodeError("envelope", f"frame is a {type(envelope).__name__}, expected a map")
    version = check_version(envelope.get("v"))
    raws = envelope.get("records")
    if not isinstance(raws, list):
        raise DecodeError("envelope", "frame has no 'records' list")
    if raws and set(map(type, raws)) != {dict}:
        # No agent or relay sends one; a frame of them is refused at once, not item by item.
        bad = sum(1 for raw in raws if type(raw) is not dict)
        raise DecodeError("records", f"{bad} of the frame's {len(raws)} records are not maps")
    return version, raws


def _check_count(frame: bytes) -> None:
    """Refuse a frame whose 'records' array is longer than its bytes could hold, from the
    array's header, before anything in it is unpacked."""
    unpacker = msgpack.Unpacker(raw=False, max_bin_len=0)
    unpacker.feed(frame)
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if type(key) is not str:
                raise DecodeError("envelope", f"a key of the frame's map is a {type(key).__name__}")
            if key != "records":
                unpacker.skip()
                continue
            count = unpacker.read_array_header()
            if count > COUNT_CHECK_RECORDS and count * MIN_RECORD_BYTES > len(frame):
                raise DecodeError(
                    "records",
                    f"frame of {len(frame)} bytes claims {count} records: a record takes at "
                    f"least {MIN_RECORD_BYTES} bytes, so at most "
                    f"{len(frame) // MIN_RECORD_BYTES} fit",
                )
            return
    except DecodeError:
        raise
    except Exception:  # not a map, truncated, not an array: unpackb says which
        return


def _step_block(raws: list[Any]) -> StepBlock | None:
    """The records as one StepBlock, or None when they are not all step records passing
    ``_step_fast``'s checks with the first record's run, rank, identity and metric names.
    Checked column by column (a few C-level passes), not record by record."""
    first = raws[0]
    if type(first) is not dict or "epoch" not in first or _step_fast(first, copy=False) is None:
        return None
    try:
        rows = [_block_fields(raw) for raw in raws]  # unknown fields are ignored, as ever
    except (KeyError, TypeError):  # a field missing, or a record that is not a map
        return None
    runs, ranks, sizes, hosts, pids, kinds, seq, time_, step, epoch, maps = zip(*rows, strict=True)
    run, rank, world_size, host, pid = (first[k] for k in _BLOCK_SAME)
    inc = first.get("inc", 0)
    incs = tuple(raw.get("inc", 0) for raw in raws)  # every raw is a map: the fields were found
    if not _all_type(incs, int) or set(incs) != {inc} or not _inc_ok(inc):
        return None
    if not _all_hashable(runs, hosts, kinds):
        return None
    if not (
        set(runs) == {run} and set(hosts) == {host} and set(kinds) == {"step"}
        and _all_type(ranks, int) and set(ranks) == {rank}
        and _all_type(sizes, int) and set(sizes) == {world_size}
        and _all_type(pids, int) and set(pids) == {pid}
        and _all_type(seq, int) and min(seq) >= 1 and max(seq) < _INT64_END
        and _all_type(time_, float)
        and _all_type(step, int) and min(step) >= -_INT64_END and max(step) < _INT64_END
        and _all_type(maps, dict)
    ):  # fmt: skip
        return None
    if not _all_type(epoch, int):
        if not all(e is None or (type(e) is int and -_INT64_END <= e < _INT64_END) for e in epoch):
            return None
    elif min(epoch) < -_INT64_END or max(epoch) >= _INT64_END:
        return None
    values = metric_columns(tuple(first["metrics"]), maps)
    if values is None or not all(_all_type(column, float) for column in values.values()):
        return None
    return StepBlock(
        run, rank, world_size, host, pid, list(seq), list(time_), list(step), list(epoch), values,
        inc,
    )  # fmt: skip


def _inc_ok(inc: Any) -> bool:
    return type(inc) is int and 0 <= inc < _INT64_END


def _all_type(column: Sequence[Any], kind: type) -> bool:
    """Every item of ``column`` is exactly of type ``kind`` (bool is not an int here)."""
    return set(map(type, column)) == {kind}


def _all_hashable(*columns: tuple[Any, ...]) -> bool:
    """No list or map among the values (a bad record; ``set()`` of it would raise)."""
    return all(set(map(type, column)) <= {str, int, float, bool, type(None)} for column in columns)


def metric_columns(names: tuple[str, ...], maps: Sequence[Any]) -> dict[str, list[Any]] | None:
    """Metric name -> one value per map, when every map holds exactly ``names``; else None.
    (A StepBlock's ``metrics``; the aggregator's fast decoder builds its blocks with it too.)"""
    if set(map(len, maps)) != {len(names)}:
        return None
    if not names:
        return {}
    getter = _getters.get(names)
    if getter is None:
        if len(_getters) > 256:  # metric name sets a peer makes up must not grow this
            _getters.clear()
        getter = _getters[names] = itemgetter(*names)
    try:  # as many names as ``names`` and all of them: the same names
        rows = list(map(getter, maps))
    except KeyError:
        return None
    if len(names) == 1:
        return {names[0]: rows}
    return {name: list(column) for name, column in zip(names, zip(*rows, strict=True), strict=True)}


_BLOCK_SAME = ("run", "rank", "world_size", "host", "pid")  # one value per StepBlock
_block_fields = itemgetter(
    *_BLOCK_SAME, "kind", *(name for name in _STEP_FIELDS if name not in _BLOCK_SAME)
)
_getters: dict[tuple[str, ...], Any] = {}


def check_version(version: Any) -> int:
    """``version`` when it is a schema version this aggregator reads; else ``DecodeError``."""
    if type(version) is not int:
        raise DecodeError("envelope", f"schema version 'v' missing or not an int: {_show(version)}")
    if version > SCHEMA_VERSION:
        raise DecodeError(
            "version",
            f"schema version {version} is newer than this aggregator's {SCHEMA_VERSION}: "
            "upgrade rankwatch on the head node",
        )
    if version < 1:
        raise DecodeError("version", f"schema version {version} is not valid")
    return version


def decode_record(raw: Any) -> Record:
    """Validate one record map (from msgpack or a JSONL line) into a dataclass."""
    return _step_fast(raw, copy=True) or _decode_checked(raw)


def _decode_checked(raw: Any) -> Record:
    """``decode_record`` field by field: every kind, conversions, and the error messages."""
    if not isinstance(raw, dict):
        raise DecodeError("field", f"record is a {type(raw).__name__}, expected a map")
    kind = raw.get("kind")
    if kind == "step":
        return StepRecord(
            *_common(raw),
            world_size=_int(raw, "world_size", minimum=1),
            host=_str(raw, "host", allow_empty=True),
            pid=_int(raw, "pid", minimum=0),
            step=_int(raw, "step"),
            epoch=_opt_int(raw, "epoch"),
            metrics=_metrics(raw),
            inc=_inc(raw),
        )
    if kind == "event":
        event = _str(raw, "event")
        if event not in EVENT_KINDS:
            raise DecodeError("field", f"field 'event' is {event!r}, expected one of {EVENT_KINDS}")
        info = raw.get("info", {})
        if not isinstance(info, dict):
            raise DecodeError("field", f"field 'info' must be a map, got {type(info).__name__}")
        _check_depth(info)
        return EventRecord(
            *_common(raw),
            world_size=_int(raw, "world_size", minimum=1),
            host=_str(raw, "host", allow_empty=True),
            pid=_int(raw, "pid", minimum=0),
            event=event,
            step=_opt_int(raw, "step"),
            info=info,
            inc=_inc(raw),
        )
    if kind == "heartbeat":
        paused = raw.get("paused")
        if paused is not None and not isinstance(paused, str):
            raise DecodeError("field", "field 'paused' must be a string or null")
        stack, problem = _stack(raw.get("stack"))
        return Heartbeat(
            *_common(raw),
            last_step=_opt_int(raw, "last_step"),
            next_in=_float(raw, "next_in"),
            dropped=_int(raw, "dropped", minimum=0),
            paused=paused,
            inc=_inc(raw),
            stack=stack,
            stack_problem=problem,
        )
    if kind == "telemetry":
        return TelemetryRecord(
            *_common(raw),
            host=_str(raw, "host", allow_empty=True),
            pid=_int(raw, "pid", minimum=0),
            source=_str(raw, "source", max_chars=MAX_SOURCE_CHARS),
            device=_str(raw, "device", allow_empty=True, max_chars=MAX_SOURCE_CHARS),
            values=_metrics(raw, "values"),
            labels=_labels(raw),
            inc=_inc(raw),
        )
    raise DecodeError("field", f"field 'kind' is {_show(kind)}, expected one of {KINDS}")


def _step_fast(raw: Any, copy: bool) -> StepRecord | None:
    """``decode_record`` for the common case, or None: a step record that passes every check
    below with a float time and float metric values. Anything else, valid or not, takes the
    field-by-field path (which converts ints and JSON spellings, and words the errors). The
    same checks in one expression: at 10^5 records/s the per-field calls cost more than they do.
    """
    if type(raw) is not dict or raw.get("kind") != "step":
        return None
    run, rank, seq, time_, world_size, host, pid, step, epoch, metrics = map(raw.get, _STEP_FIELDS)
    inc = raw.get("inc", 0)
    if not (
        type(run) is str
        and 0 < len(run) <= MAX_NAME_CHARS
        and type(rank) is int
        and 0 <= rank <= MAX_RANK
        and type(seq) is int
        and 1 <= seq < _INT64_END
        and type(time_) is float
        and type(world_size) is int
        and 1 <= world_size < _INT64_END
        and type(host) is str
        and len(host) <= MAX_NAME_CHARS
        and type(pid) is int
        and 0 <= pid < _INT64_END
        and type(step) is int
        and -_INT64_END <= step < _INT64_END
        and (epoch is None or (type(epoch) is int and -_INT64_END <= epoch < _INT64_END))
        and type(metrics) is dict
        and len(metrics) <= MAX_METRICS
        and type(inc) is int
        and 0 <= inc < _INT64_END
    ):
        return None
    for key, value in metrics.items():
        if type(value) is not float or type(key) is not str or not 0 < len(key) <= MAX_NAME_CHARS:
            return None
    if copy:
        metrics = dict(metrics)
    return StepRecord(run, rank, seq, time_, world_size, host, pid, step, epoch, metrics, inc)


# --- JSONL -------------------------------------------------------------------------------


def to_json_line(record: Record) -> str:
    """One JSONL line (with trailing newline) in strict RFC 8259 JSON."""
    wire = to_wire(record)
    wire["v"] = SCHEMA_VERSION if record.kind == "telemetry" else BASE_VERSION
    if "metrics" in wire:
        wire["metrics"] = {k: json_value(v) for k, v in wire["metrics"].items()}
    if "values" in wire:  # a telemetry record's
        wire["values"] = {k: json_value(v) for k, v in wire["values"].items()}
    if "next_in" in wire:
        wire["next_in"] = json_value(wire["next_in"])
    wire["time"] = json_value(wire["time"])
    if "info" in wire:  # free-form, so a NaN may hide anywhere in it
        wire["info"] = json_safe(wire["info"])
    return json.dumps(wire, allow_nan=False, ensure_ascii=False, default=str) + "\n"


def from_json_line(line: str) -> Record:
    """Parse one line written by ``to_json_line`` (or any agent of this schema version)."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise DecodeError("json", f"not a JSON line: {exc}") from None
    if not isinstance(raw, dict):
        raise DecodeError("field", "JSONL line is not an object")
    check_version(raw.get("v"))
    return decode_record(raw)


# --- field checks ------------------------------------------------------------------------


def _common(raw: dict[str, Any]) -> tuple[str, int, int, float]:
    return (
        _str(raw, "run"),
        _int(raw, "rank", minimum=0, maximum=MAX_RANK),
        _int(raw, "seq", minimum=1),
        _float(raw, "time"),
    )


# Error messages quote wire values: bounded, and safe for values nested deep enough to
# exhaust repr()'s recursion limit (msgpack itself allows about 1000 levels).
_short_repr = reprlib.Repr()
_short_repr.maxlevel = 3
_short_repr.maxstring = _short_repr.maxother = 60


def _show(value: Any) -> str:
    return _short_repr.repr(value)


def _check_depth(info: dict[str, Any]) -> None:
    """Reject info nested deeper than MAX_INFO_DEPTH (the store serialises it recursively)."""
    level: list[Any] = [info]
    for _ in range(MAX_INFO_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return
    raise DecodeError("field", f"field 'info' is nested deeper than {MAX_INFO_DEPTH} levels")


def _stack(raw: Any) -> tuple[StackSample | None, str]:
    """A heartbeat's ``stack``: the sample (or None) and what was wrong with it (or "")."""
    if raw is None:
        return None, ""
    try:
        sample = StackSample.from_dict(raw)
    except ValueError as exc:
        return None, f"refused: {str(exc)[:200]}"
    cut = truncation(raw)
    return sample, f"truncated: {cut}" if cut else ""


def _missing(name: str) -> DecodeError:
    return DecodeError("field", f"required field '{name}' is missing")


def _str(
    raw: dict[str, Any], name: str, allow_empty: bool = False, max_chars: int = MAX_NAME_CHARS
) -> str:
    if name not in raw:
        raise _missing(name)
    value = raw[name]
    if not isinstance(value, str):
        raise DecodeError("field", f"field '{name}' must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise DecodeError("field", f"field '{name}' is empty")
    if len(value) > max_chars:
        raise DecodeError("field", f"field '{name}' is {len(value)} chars, max {max_chars}")
    return value


def _int(
    raw: dict[str, Any], name: str, minimum: int | None = None, maximum: int = 2**63 - 1
) -> int:
    if name not in raw:
        raise _missing(name)
    value = raw[name]
    if type(value) is not int:  # bool is an int subclass and is not accepted
        raise DecodeError("field", f"field '{name}' must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise DecodeError("field", f"field '{name}' is {value}, must be >= {minimum}")
    if not -(2**63) <= value < 2**63:
        raise DecodeError("field", f"field '{name}' is out of the 64-bit range")
    if value > maximum:
        raise DecodeError("field", f"field '{name}' is {value}, must be <= {maximum}")
    return value


def _inc(raw: dict[str, Any]) -> int:
    return _int(raw, "inc", minimum=0) if "inc" in raw else 0


def _opt_int(raw: dict[str, Any], name: str) -> int | None:
    return None if raw.get(name) is None else _int(raw, name)


def _float(raw: dict[str, Any], name: str) -> float:
    if name not in raw:
        raise _missing(name)
    value = raw[name]
    if isinstance(value, str) and value in JSON_TO_NONFINITE:
        return JSON_TO_NONFINITE[value]
    if type(value) not in (float, int):
        raise DecodeError("field", f"field '{name}' must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # a JSON integer of hundreds of digits
        raise DecodeError("field", f"field '{name}' is an integer too large for a float") from None


def _metrics(raw: dict[str, Any], name: str = "metrics") -> dict[str, float]:
    """A step's ``metrics`` (or a telemetry record's ``values``): name -> float."""
    if name not in raw:
        raise _missing(name)
    metrics = raw[name]
    if not isinstance(metrics, dict):
        raise DecodeError("field", f"field '{name}' must be a map of name -> number")
    if len(metrics) > MAX_METRICS:
        raise DecodeError("field", f"{len(metrics)} {name} in one record, max {MAX_METRICS}")
    noun = "metric" if name == "metrics" else "value"
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key or len(key) > MAX_NAME_CHARS:
            raise DecodeError("field", f"{noun} name {str(key)[:40]!r} is not a valid name")
        if type(value) is float:
            out[key] = value
        elif type(value) is int:
            try:
                out[key] = float(value)
            except OverflowError:  # a JSON integer of hundreds of digits
                raise DecodeError(
                    "field", f"{noun} '{key[:40]}' is an integer too large for a float"
                ) from None
        elif isinstance(value, str) and value in JSON_TO_NONFINITE:
            out[key] = JSON_TO_NONFINITE[value]
        else:
            raise DecodeError(
                "field", f"{noun} '{key[:40]}' must be a number, got {type(value).__name__}"
            )
    return out


def _labels(raw: dict[str, Any]) -> dict[str, str]:
    """A telemetry record's ``labels``: name -> short text."""
    if "labels" not in raw:
        raise _missing("labels")
    labels = raw["labels"]
    if not isinstance(labels, dict):
        raise DecodeError("field", "field 'labels' must be a map of name -> string")
    if len(labels) > MAX_LABELS:
        raise DecodeError("field", f"{len(labels)} labels in one record, max {MAX_LABELS}")
    for key, value in labels.items():
        if not isinstance(key, str) or not key or len(key) > MAX_NAME_CHARS:
            raise DecodeError("field", f"label name {str(key)[:40]!r} is not a valid name")
        if not isinstance(value, str):
            raise DecodeError(
                "field", f"label '{key[:40]}' must be a string, got {type(value).__name__}"
            )
        if len(value) > MAX_LABEL_CHARS:
            raise DecodeError(
                "field", f"label '{key[:40]}' is {len(value)} chars, max {MAX_LABEL_CHARS}"
            )
    return dict(labels)
