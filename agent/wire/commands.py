"""Commands from the aggregator to a rank, and the rank's acknowledgements: the wire form.

A command rides the DEALER/ROUTER connection the records come in on, as the resend requests
do: one msgpack map per ZeroMQ message, ``{"v": 1, "cv": COMMAND_VERSION, "cmd": kind, ...}``.
``cv`` versions the command itself (the frame's schema version is the records'): a rank that
gets a ``cv`` newer than its own refuses the command and says so in its acknowledgement.

====== ========== ===========================================================================
field  type       meaning
====== ========== ===========================================================================
cmd    str        one of ``COMMAND_KINDS``: ``checkpoint``, ``stop``, ``note``
id     str        1 to ``MAX_ID_CHARS`` of ``[0-9A-Za-z_.:-]``: a rank acts on an id once
run    str        the run it is for (a relay routes on run and rank; a rank checks both)
rank   int        the rank it is for
step   int/None   checkpoint and stop: the step at whose end every rank acts (the same on
                  every rank, so the collectives of the last step all complete); None: note
text   str        note: the message for the rank's log (at most ``MAX_TEXT_CHARS``)
by     str        who asked: ``policy:<name>``, ``page``, ``cli`` (at most ``MAX_BY_CHARS``)
inc    int        optional: only the agent of this incarnation acts on it
hold   bool       optional: act at ``step`` only after a ``go`` for this id (see below)
====== ========== ===========================================================================

A checkpoint or stop the aggregator sends to every rank of a run is held (``hold``): every
rank answers with the step it is at, and only when all of them can still reach the named step
does the aggregator send ``go`` (the same map with ``cmd`` "go"); when one is already past it,
``move`` names a later step for all; when one refused, or did not answer, ``abort`` cancels it
for all. A rank that reaches the step before the ``go`` waits there (at most ``HOLD_MAX_S``,
then it goes on without acting), so in lockstep training either every rank leaves after the
same step or none does. ``go``, ``move`` and ``abort`` (``DECISIONS``) name a held id and need
no opt-in.

An acknowledgement is an ``event`` record of kind ``ACK_EVENT`` ("command") in the rank's own
record stream (so it is in its JSONL file too, and a resend or an import carries it); its
``info`` is ``Ack.info()``: ``id``, ``cmd``, ``state`` (one of ``ACK_STATES``), ``step`` (the
rank's last step when it acted), ``at`` (the step the command named) and ``detail``.

``received`` comes when a rank takes a command it opted into, ``done`` or ``failed`` when it
acted, ``refused`` when it will not act (not opted in, a newer ``cv``, a command for another
run or rank, a malformed one: ``detail`` says which), ``late`` when the named step had already
passed (it acts at its next step end instead), ``replayed`` for an id it has seen (nothing is
done again). An agent from before commands ignores them (it logs "ignored control frame" once)
and never acknowledges: the aggregator marks its ranks ``no_ack`` after a timeout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

COMMAND_VERSION = 1
COMMAND_KINDS = ("checkpoint", "stop", "note")
DECISIONS = ("go", "move", "abort")  # the aggregator's word on a held command
ACK_EVENT = "command"  # the event kind acknowledgements travel as
ACK_STATES = ("received", "done", "failed", "refused", "late", "replayed", "aborted")
FINAL_STATES = ("done", "failed", "refused", "replayed", "aborted")  # nothing more comes
HOLD_MAX_S = 10.0  # a rank waits at most this long at a held step for the aggregator's word
MAX_ID_CHARS = 32
MAX_TEXT_CHARS = 500
MAX_BY_CHARS = 128
MAX_DETAIL_CHARS = 300
MAX_RUN_CHARS = 256
ACCEPT_ENV = "RANKWATCH_ACCEPT"  # "checkpoint,stop", "all" or "none"
_ID = re.compile(rf"[0-9A-Za-z_.:-]{{1,{MAX_ID_CHARS}}}")
_INT64 = 2**63


class CommandError(ValueError):
    """A command or acknowledgement that does not follow this module. ``reason``: a short key
    for counters (``field``, ``version``, ``kind``); the message says what was wrong."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Command:
    id: str
    kind: str
    run: str
    rank: int
    step: int | None = None
    text: str = ""
    by: str = ""
    inc: int = 0
    hold: bool = False

    def __post_init__(self) -> None:
        check_id(self.id)
        if self.kind not in COMMAND_KINDS + DECISIONS:
            raise CommandError("kind", f"command {self.kind!r} is not one of {COMMAND_KINDS}")
        if type(self.hold) is not bool:
            raise CommandError("field", f"command hold {_short(self.hold)} is not true/false")
        if not isinstance(self.run, str) or not 0 < len(self.run) <= MAX_RUN_CHARS:
            raise CommandError("field", f"command run {_short(self.run)} is not a run name")
        if type(self.rank) is not int or not 0 <= self.rank < 2**31:
            raise CommandError("field", f"command rank {_short(self.rank)} is not a rank")
        if self.kind != "note" and (type(self.step) is not int or not 0 <= self.step < _INT64):
            raise CommandError("field", f"{self.kind} needs a step >= 0, got {_short(self.step)}")
        if self.kind == "note" and self.step is not None:
            raise CommandError("field", "a note names no step")
        if not isinstance(self.text, str) or len(self.text) > MAX_TEXT_CHARS:
            raise CommandError("field", f"command text must be a string of <= {MAX_TEXT_CHARS}")
        if not isinstance(self.by, str) or len(self.by) > MAX_BY_CHARS:
            raise CommandError("field", f"command 'by' must be a string of <= {MAX_BY_CHARS}")
        if type(self.inc) is not int or not 0 <= self.inc < _INT64:
            raise CommandError("field", f"command inc {_short(self.inc)} is not an incarnation")

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": 1, "cv": COMMAND_VERSION, "cmd": self.kind, "id": self.id}
        out.update(run=self.run, rank=self.rank, step=self.step, text=self.text, by=self.by)
        if self.inc:
            out["inc"] = self.inc
        if self.hold:
            out["hold"] = True
        return out

    @classmethod
    def from_wire(cls, raw: Any) -> Command:
        """The command in ``raw`` (a control map with ``cmd``); ``CommandError`` says what is
        wrong with one that is not (a newer ``cv``: reason ``version``)."""
        if not isinstance(raw, Mapping):
            raise CommandError("field", "a command must be a map")
        version = raw.get("cv")
        if type(version) is not int or version < 1:
            raise CommandError("field", f"command version 'cv' missing or bad: {_short(version)}")
        if version > COMMAND_VERSION:
            raise CommandError(
                "version",
                f"command version {version} is newer than this agent's {COMMAND_VERSION}: "
                "upgrade rankwatch on the ranks",
            )
        text, by = raw.get("text", ""), raw.get("by", "")
        return cls(
            id=raw.get("id"),  # type: ignore[arg-type]  # checked in __post_init__
            kind=raw.get("cmd"),  # type: ignore[arg-type]
            run=raw.get("run"),  # type: ignore[arg-type]
            rank=raw.get("rank"),  # type: ignore[arg-type]
            step=raw.get("step"),
            text="" if text is None else text,
            by="" if by is None else by,
            inc=raw.get("inc", 0),
            hold=raw.get("hold", False),
        )


def is_command(message: Mapping[str, Any]) -> bool:
    """A control map that is a command (not a resend request)."""
    return "cmd" in message


def check_id(value: Any) -> str:
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise CommandError(
            "field", f"command id {_short(value)} must be 1-{MAX_ID_CHARS} of [0-9A-Za-z_.:-]"
        )
    return value


@dataclass(frozen=True)
class Ack:
    """A rank's answer to one command (the ``info`` of its ``command`` event)."""

    id: str
    cmd: str
    state: str
    step: int | None = None  # the rank's last step when it answered
    at: int | None = None  # the step the command named (a late rank: the one it acts at)
    detail: str = ""

    def __post_init__(self) -> None:
        check_id(self.id)
        if not isinstance(self.cmd, str) or len(self.cmd) > 32:
            raise CommandError("field", f"ack cmd {_short(self.cmd)} is not a command kind")
        if self.state not in ACK_STATES:
            raise CommandError("field", f"ack state {_short(self.state)} not in {ACK_STATES}")
        for name in ("step", "at"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not -_INT64 <= value < _INT64):
                raise CommandError("field", f"ack {name} {_short(value)} is not a step")
        if not isinstance(self.detail, str):
            raise CommandError("field", "ack detail must be a string")

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "cmd": self.cmd, "state": self.state, "step": self.step,
                "at": self.at, "detail": self.detail[:MAX_DETAIL_CHARS]}  # fmt: skip

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Ack:
        detail = info.get("detail", "")
        return cls(
            id=info.get("id"),  # type: ignore[arg-type]  # checked in __post_init__
            cmd=info.get("cmd"),  # type: ignore[arg-type]
            state=info.get("state"),  # type: ignore[arg-type]
            step=info.get("step"),
            at=info.get("at"),
            detail=str(detail)[:MAX_DETAIL_CHARS],
        )


def parse_accept(value: str | Iterable[str] | None) -> frozenset[str]:
    """The command kinds a rank opts into: ``("checkpoint", "stop")``, ``"checkpoint,stop"``,
    ``"all"``, ``"none"`` or ``""``/None (none). An unknown kind is a ``ValueError``."""
    if value is None:
        return frozenset()
    items = value.replace(";", ",").split(",") if isinstance(value, str) else list(value)
    names = {str(item).strip().lower() for item in items} - {""}
    if names == {"none"}:
        return frozenset()
    if "all" in names:
        names = (names - {"all"}) | set(COMMAND_KINDS)
    unknown = sorted(names - set(COMMAND_KINDS))
    if unknown:
        raise ValueError(
            f"accept: unknown command kind(s) {', '.join(unknown)}; known: "
            f"{', '.join(COMMAND_KINDS)} (or 'all', 'none')"
        )
    return frozenset(names)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
