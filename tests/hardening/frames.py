"""Bad input for the ingest port: random and mutated frames, and what the aggregator must make
of each (shared by tests/hardening/test_fuzz.py and bench/fuzz_ingest.py).

``random_message(rng)`` returns one ZeroMQ message (a list of frames; almost always one) drawn
from valid frames, mutations of valid frames (bit flips, truncation, splices), records with a
field missing or of the wrong type, huge names, deep nesting, unicode, NaN/Inf everywhere,
negative and repeated steps, newer schema versions, envelopes that are not maps, raw bytes and
multipart messages. ``Expected`` predicts, with the wire schema itself, what the receiver
counts for each message: rejections by reason, and the valid records that must be stored.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
from rankwatch.agent.wire import records

FUZZ_RUNS = ("fuzz-a", "fuzz-b", "fuzz-ç中", "fuzz-\U0001f525")
ODD_RUN = "fuzz-odd-steps"  # steps going back or extreme: in one run (see valid_record)
FUZZ_RANKS = 8
NONFINITE = (math.nan, math.inf, -math.inf)
BIG = 2**63 - 1
WEIRD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, BIG, -(2**63), 2**64 - 1, 1.5, math.nan, math.inf, -math.inf,
    "", "x", "NaN", "Infinity", "é" * 300, b"\x00\xff", [], {}, [1, [2, [3]]], {"a": {"b": 1}},
)  # fmt: skip


_DEEP = "\x00deep:"  # a string standing for nesting deeper than msgpack's packer allows


def pack(obj: Any) -> bytes:
    data = msgpack.packb(obj, use_bin_type=True)
    while (at := data.find(_DEEP.encode())) >= 0:
        # Splice the nesting in by hand: msgpack-python refuses to pack past 511 levels.
        end = data.index(b"\x00", at + 1) + 1  # the marker string ends with a NUL too
        marker = msgpack.packb(data[at:end].decode())  # its header, then its bytes
        start = end - len(marker)
        depth = int(data[at + len(_DEEP) : end - 1])
        data = data[:start] + b"\x91" * depth + msgpack.packb("x") + data[end:]
    return data


class Sequencer:
    """Mostly increasing seqs per (run, rank), with repeats and jumps like real traffic; steps
    only ever increase."""

    def __init__(self) -> None:
        self.next: dict[tuple[str, int], int] = {}
        self.steps: dict[tuple[str, int], int] = {}

    def step(self, run: str, rank: int) -> int:
        step = self.steps.get((run, rank), 0) + 1
        self.steps[(run, rank)] = step
        return step

    def take(self, rng: random.Random, run: str, rank: int) -> int:
        key = (run, rank)
        seq = self.next.get(key, 1)
        roll = rng.random()
        if roll < 0.05:
            return max(1, seq - rng.randint(1, 50))  # a repeat: a duplicate, or a late record
        if roll < 0.07:
            seq += rng.randint(2, 1000)  # a jump: a gap the aggregator will ask to be resent
        self.next[key] = seq + 1
        return seq


def _float(rng: random.Random) -> float:
    roll = rng.random()
    if roll < 0.1:
        return rng.choice(NONFINITE)
    if roll < 0.15:
        return rng.choice((0.0, -0.0, 5e-324, 1.7976931348623157e308, -1e308))
    return rng.uniform(-10, 10)


# Valid metric names: odd but a bounded set, as a real job has (the store keeps one series per
# name; random names go to the records that are invalid anyway, or to the unit tests).
NAMES = (
    "loss", "lr", "grad_norm", "acc", "tokens", "loss/scale", "m" * records.MAX_NAME_CHARS,
    "a b", "../../etc/x", "<script>alert(1)</script>", "\x00nul", "\n", "%s%n", "{}", "损失",
    "\U0001f525", "\u202eevil",
)  # fmt: skip


def _name(rng: random.Random) -> str:
    return rng.choice(NAMES)


def _random_name(rng: random.Random) -> str:
    return "".join(chr(rng.choice((rng.randint(32, 126), rng.randint(0xA0, 0xD7FF))))
                   for _ in range(rng.randint(1, 20)))  # fmt: skip


def valid_record(rng: random.Random, seqs: Sequencer) -> dict[str, Any]:
    # Steps going back arrive late for the store (each such flush re-bands the series they
    # touch): in one run of their own, so they are tried without swamping every series.
    odd = rng.random() < 0.01
    run, rank = ODD_RUN if odd else rng.choice(FUZZ_RUNS), rng.randrange(FUZZ_RANKS)
    base: dict[str, Any] = {
        "run": run, "rank": rank, "seq": seqs.take(rng, run, rank),
        "time": _float(rng) if rng.random() < 0.05 else 1.7e9 + rng.random() * 1e6,
    }  # fmt: skip
    kind = rng.choices(("step", "event", "heartbeat"), (8, 1, 1))[0]
    if kind == "heartbeat":
        return {"kind": kind, **base, "last_step": rng.choice((None, rng.randint(-5, 10**9))),
                "next_in": _float(rng), "dropped": rng.randint(0, 10**6),
                "paused": rng.choice((None, "checkpoint", "é"))}  # fmt: skip
    ident = {"world_size": rng.choice((1, 2, FUZZ_RANKS, 10**6)), "host": rng.choice(("h", "")),
             "pid": rng.randint(0, 2**31)}  # fmt: skip
    step = seqs.step(run, rank)
    if odd:
        step = rng.choice((-3, 0, 7, step, BIG, -(2**63) + 1))
    if kind == "event":
        info = {_random_name(rng): rng.choice((1, "x", [1.5, None], {"k": math.nan}))}
        return {"kind": kind, **base, **ident, "event": rng.choice(records.EVENT_KINDS),
                "step": rng.choice((None, step)), "info": info}  # fmt: skip
    metrics = {_name(rng): _float(rng) for _ in range(rng.randint(0, 6))}
    if rng.random() < 0.05:
        metrics.update({"s": rng.choice(("NaN", "Infinity", "-Infinity")), "i": rng.randint(-9, 9)})
    return {"kind": kind, **base, **ident, "step": step,
            "epoch": rng.choice((None, 0, -1, 7)), "metrics": metrics}  # fmt: skip


def _deep(depth: int) -> Any:
    """``depth`` nested one-element lists around "x" (see ``pack`` for the deep ones)."""
    if depth > 400:
        return f"{_DEEP}{depth}\x00"
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def broken_record(rng: random.Random, seqs: Sequencer) -> dict[str, Any]:
    """A record with exactly one thing wrong (or made weird)."""
    rec = valid_record(rng, seqs)
    key = rng.choice(list(rec))
    roll = rng.randrange(10)
    if roll == 0:
        del rec[key]
    elif roll <= 3:
        rec[key] = rng.choice(WEIRD_VALUES)
    elif roll == 4:
        rec[key] = "n" * rng.choice((records.MAX_NAME_CHARS + 1, 1000, 1000, 50_000))
    elif roll == 5:
        rec[key] = _deep(rng.choice((5, 40, 200, 900)))
    elif roll == 6 and rec["kind"] == "event":
        rec["info"] = {"deep": _deep(rng.choice((10, 31, 33, 100)))}
    elif roll == 6 and rec["kind"] == "step":
        rec["metrics"] = {f"m{i}": 1.0 for i in range(records.MAX_METRICS + rng.randint(1, 3))}
    elif roll == 7:
        name = rng.choice(("rank", "seq", "world_size", "step"))
        rec[name] = rng.choice((-1, 0, records.MAX_RANK + 1, 2**63, 2**64 - 1, math.nan, 1.0, True))
        if name == "step":
            rec["run"] = ODD_RUN
    elif roll == 8:
        rec["kind"] = rng.choice(("Step", "steps", "", "event ", None, 1))
    else:
        rec[rng.choice(("extra", "v", "ÿ"))] = rng.choice(WEIRD_VALUES)  # unknown: ignored
    return rec


def envelope(rng: random.Random, recs: list[Any]) -> bytes:
    roll = rng.random()
    if roll < 0.9:
        return pack({"v": records.SCHEMA_VERSION, "records": recs})
    return pack(rng.choice((
        {"v": records.SCHEMA_VERSION + rng.randint(1, 5), "records": recs},  # a newer agent
        {"v": rng.choice((0, -1, "1", 1.0, None, True)), "records": recs},
        {"records": recs},
        {"v": 1, "records": rng.choice(({}, "r", 5, None))},
        {"v": 1},
        recs,
        rng.choice(WEIRD_VALUES),
    )))  # fmt: skip


def mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    roll = rng.randrange(4)
    if roll == 0 and data:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif roll == 1 and data:
        del data[rng.randrange(len(data)) :]
    elif roll == 2:
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.randint(1, 16))
    elif data:
        at = rng.randrange(len(data))
        data[at] = rng.choice((0xC1, 0xDD, 0xDF, 0xDC, 0xC7, 0xD4, 0xFF, 0x00))
    return bytes(data)


def random_message(rng: random.Random, seqs: Sequencer, bounded: bool = False) -> list[bytes]:
    """One message (frames after the identity) of a random kind; see the module docstring.

    A bit flip in a valid frame may leave it valid with a new run or metric name. With
    ``bounded`` such mutations are drawn again, so that a long run keeps to a bounded set of
    series (the store's cost grows with the number of series; see docs/reliability.md).
    """
    roll = rng.random()
    if roll < 0.25:
        return [envelope(rng, [valid_record(rng, seqs) for _ in range(rng.randint(1, 4))])]
    if roll < 0.55:
        good = [valid_record(rng, seqs) for _ in range(rng.randint(1, 3))]
        frame = pack({"v": records.SCHEMA_VERSION, "records": good})
        for _ in range(10):
            mutated = mutate(rng, frame)
            if not bounded or all(_known(rec) for rec in accepted(mutated)):
                return [mutated]
        return [frame[: len(frame) // 2]]
    if roll < 0.85:
        recs = [broken_record(rng, seqs) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            recs.append(valid_record(rng, seqs))  # a bad record next to a good one
        return [envelope(rng, recs)]
    if roll < 0.95:
        return [rng.randbytes(rng.randint(0, 200))]
    if roll < 0.98:
        return [*[pack({"v": 1, "records": []}), b"extra"][: rng.randint(1, 2)], b"x"]
    return [pack({"v": 1, "records": [_deep(rng.choice((100, 1000, 1023, 5000)))]})]


KNOWN_RUNS = frozenset((*FUZZ_RUNS, ODD_RUN, *(v for v in WEIRD_VALUES if isinstance(v, str))))
KNOWN_METRICS = frozenset((*NAMES, "s", "i"))


def _known(rec: records.Record) -> bool:
    if rec.run not in KNOWN_RUNS:
        return False
    return not isinstance(rec, records.StepRecord) or rec.metrics.keys() <= KNOWN_METRICS


def accepted(frame: bytes) -> list[records.Record]:
    """The records the receiver keeps from one frame (the valid ones of a partly bad frame)."""
    return _decode(frame, Counter())[0]


def _decode(frame: bytes, reasons: Counter[str]) -> tuple[list[records.Record], int]:
    """(valid records, bad records) as the receiver decides them; counts reasons."""
    try:
        return records.decode_frame(frame), 0
    except records.DecodeError as exc:
        if exc.reason != "field":
            reasons[exc.reason] += 1
            return [], -1  # the whole message is bad
    good: list[records.Record] = []
    bad = 0
    raw = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=0)
    for item in raw["records"]:
        try:
            good.append(records.decode_record(item))
        except records.DecodeError as exc:
            reasons[exc.reason] += 1
            bad += 1
    return good, bad


@dataclass
class Expected:
    """What the receiver must count for the messages ``add``ed, decided by the wire schema."""

    messages: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    bad_messages: int = 0
    bad_records: int = 0
    good_records: int = 0
    stored: set[tuple[str, int, int]] = field(default_factory=set)  # unique (run, rank, seq)

    def add(self, message: list[bytes]) -> None:
        self.messages += 1
        if len(message) != 1:
            self.reasons["frames"] += 1
            self.bad_messages += 1
            return
        good, bad = _decode(message[0], self.reasons)
        if bad < 0:
            self.bad_messages += 1
            return
        self.bad_records += bad
        self.good_records += len(good)
        self.stored.update((r.run, r.rank, r.seq) for r in good)
