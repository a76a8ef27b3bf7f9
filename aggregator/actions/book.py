"""Every command the aggregator sent and what each rank answered: the command state machine.

Pure: ``now`` is passed in, sending is the caller's (``sends`` says what is due, ``sent`` what
went). Per rank a command goes

    pending --sent--> sent --ack--> received | late --ack--> done | failed
                           \\--ack--> refused | done | failed
    pending | sent  --no ack within ACK_TIMEOUT_S--> no_ack   (a later ack still counts)
    received (go)   --the rank reports PASSED_STEPS past the step, no answer--> failed

A held command (checkpoint and stop: ``wire/commands.py``) also has a phase: ``ask`` until every
rank answered (or ``ASK_TIMEOUT_S``), then ``go`` when all can still reach the step, ``move``
(a later step for all, at most ``MAX_MOVES`` times) when one is past it, ``abort`` when one
refused, failed or did not answer: all ranks act at one step, or none does.

A rank that has not answered is sent the command again every ``RETRY_S``, ``MAX_SENDS`` times
(control messages are best effort; the rank acts on an id once and answers a repeat with
``replayed``). A ``replayed`` answer says the rank has it: a rank still waiting becomes
``received``. Acks for ids this book does not hold (another aggregator's, or made up) and
acks of ranks a command was not for are counted, never applied.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rankwatch.agent.wire.commands import Ack, Command, CommandError

ASK_TIMEOUT_S = 4.0  # a held command waits this long for every rank's answer, then aborts
MAX_MOVES = 3  # a held command moved this often to a later step is aborted
RETRY_S = 1.0  # a rank without an answer is sent the command again after this long ...
MAX_SENDS = 5  # ... this many times at most
ACK_TIMEOUT_S = 15.0  # no answer this long after the command was made: no_ack
PASSED_STEPS = 2  # a rank told go that reports this many steps past the step did not act
MAX_KEPT = 4096  # commands held; the oldest settled ones are dropped first
WAITING = ("pending", "sent")  # no answer yet
SETTLED = ("done", "failed", "refused", "no_ack", "aborted")  # nothing more is expected


@dataclass
class RankAnswer:
    state: str = "pending"
    sends: int = 0
    last_send: float = -math.inf
    step: int | None = None  # the rank's step in its latest answer
    at: int | None = None  # the step it acts at
    detail: str = ""
    time: float | None = None  # when the latest answer came
    word: str = "cmd"  # what it is to be sent (again): cmd, go, move, abort, or "" (nothing)

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "sends": self.sends, "step": self.step, "at": self.at,
                "detail": self.detail, "time": self.time}  # fmt: skip


@dataclass
class Issued:
    """One command to some ranks of one run (the same id, kind and step for each)."""

    id: str
    run: str
    kind: str
    ranks: tuple[int, ...]
    step: int | None
    by: str
    reason: str
    created: float
    text: str = ""
    incs: Mapping[int, int] = field(default_factory=dict)  # rank -> its incarnation
    answers: dict[int, RankAnswer] = field(default_factory=dict)
    updated: float = 0.0
    incident: str = ""  # the incident a policy acted on ("" when a person asked)
    hold: bool = False
    phase: str = ""  # held: ask, go, abort (moves go back to ask)
    asked: float = 0.0  # when the current ask began
    moves: int = 0
    margin: int = 2  # steps between the highest reported and the step named, for a move

    def message(self, rank: int, word: str = "cmd") -> dict[str, Any]:
        """The wire map for ``rank``: the command itself, or go / move / abort for it."""
        kind = self.kind if word == "cmd" else word
        text = self.reason[:500] if word == "abort" else self.text
        cmd = Command(self.id, kind, self.run, rank, self.step, text, self.by,
                      self.incs.get(rank, 0), self.hold and word == "cmd")  # fmt: skip
        return cmd.to_wire()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for answer in self.answers.values():
            out[answer.state] = out.get(answer.state, 0) + 1
        return out

    @property
    def state(self) -> str:
        """``done`` when every rank did it; ``waiting`` while any may still answer;
        ``incomplete`` when it is settled and some rank did not (refused, failed, no_ack)."""
        states = {a.state for a in self.answers.values()}
        if self.phase == "abort" and not states & {"sent", "pending"}:
            return "aborted"
        if states <= {"done"}:
            return "done"
        if states <= set(SETTLED):
            return "incomplete"
        return "waiting"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "run": self.run, "cmd": self.kind, "ranks": list(self.ranks),
            "step": self.step, "by": self.by, "reason": self.reason, "text": self.text,
            "created": self.created, "updated": self.updated, "state": self.state,
            "counts": self.counts(), "incident": self.incident, "phase": self.phase,
            "moves": self.moves,
            "acks": {str(rank): a.as_dict() for rank, a in sorted(self.answers.items())},
        }  # fmt: skip

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Issued:
        """A stored command back (``as_dict``), to take answers that come after a restart."""
        issued = cls(
            str(body["id"]), str(body["run"]), str(body["cmd"]),
            tuple(int(r) for r in body["ranks"]), body.get("step"), str(body.get("by", "")),
            str(body.get("reason", "")), float(body["created"]), str(body.get("text", "")),
        )  # fmt: skip
        issued.updated = float(body.get("updated", issued.created))
        issued.incident = str(body.get("incident") or "")
        issued.phase, issued.moves = str(body.get("phase") or ""), int(body.get("moves") or 0)
        for rank, raw in (body.get("acks") or {}).items():
            answer = RankAnswer(str(raw.get("state", "pending")), int(raw.get("sends", 0)))
            answer.step, answer.at = raw.get("step"), raw.get("at")
            answer.detail, answer.time = str(raw.get("detail", "")), raw.get("time")
            answer.word = ""  # a restarted aggregator re-sends nothing: the ranks decide alone
            issued.answers[int(rank)] = answer
        return issued


class CommandBook:
    """The commands held, by id. ``n``: what was refused or odd, for the counters."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, Issued] = OrderedDict()
        self.n = {"commands_issued": 0, "commands_sends": 0, "commands_send_failed": 0,
                  "command_acks": 0, "command_acks_unknown": 0, "command_acks_bad": 0,
                  "command_acks_replayed": 0, "command_acks_after_timeout": 0,
                  "command_refused": 0, "command_no_ack": 0, "commands_moved": 0,
                  "commands_aborted": 0, "command_not_acted": 0}  # fmt: skip

    def __contains__(self, ident: str) -> bool:
        return ident in self._held

    def get(self, ident: str) -> Issued | None:
        return self._held.get(ident)

    def of_run(self, run: str) -> list[Issued]:
        return [c for c in self._held.values() if c.run == run]

    def issue(
        self,
        ident: str,
        run: str,
        kind: str,
        ranks: Iterable[int],
        step: int | None,
        *,
        now: float,
        by: str,
        reason: str = "",
        text: str = "",
        incs: Mapping[int, int] | None = None,
        incident: str = "",
        hold: bool = False,
        margin: int = 2,
    ) -> Issued:
        """Hold a new command; ``CommandError`` for a bad one or an id already held."""
        if ident in self._held:
            raise CommandError("replayed", f"command id {ident!r} was already issued")
        ranks = tuple(sorted(set(ranks)))
        if not ranks:
            raise CommandError("field", "a command needs at least one rank")
        issued = Issued(ident, run, kind, ranks, step, by[:128], reason[:500], now, text,
                        dict(incs or {}))  # fmt: skip
        issued.message(ranks[0])  # checks the fields the wire form checks
        issued.answers = {rank: RankAnswer() for rank in ranks}
        issued.updated = now
        issued.incident = incident
        if hold and kind != "note":
            issued.hold, issued.phase, issued.asked, issued.margin = True, "ask", now, margin
        self._keep(issued)
        self.n["commands_issued"] += 1
        return issued

    def restore(self, body: Mapping[str, Any]) -> None:
        """Take a stored command back (after a restart), so late answers still find it."""
        try:
            issued = Issued.from_dict(body)
        except (KeyError, TypeError, ValueError):
            return
        if issued.id not in self._held:
            self._keep(issued)

    def _keep(self, issued: Issued) -> None:
        self._held[issued.id] = issued
        if len(self._held) > MAX_KEPT:
            for ident, old in list(self._held.items()):
                if old.state != "waiting":
                    del self._held[ident]
                    break
            else:
                self._held.popitem(last=False)

    def sends(self, now: float) -> list[tuple[Issued, int, dict[str, Any]]]:
        """(command, rank, message) to send now: what each rank still has to hear (the
        command, or go / move / abort for it), due a (re)send."""
        out = []
        for issued in self._held.values():
            for rank, answer in issued.answers.items():
                if (
                    answer.word
                    and answer.sends < MAX_SENDS
                    and now - answer.last_send >= RETRY_S
                    and now - issued.created < ACK_TIMEOUT_S + ASK_TIMEOUT_S * (1 + MAX_MOVES)
                ):
                    out.append((issued, rank, issued.message(rank, answer.word)))
        return out

    def sent(self, issued: Issued, rank: int, now: float, ok: bool) -> None:
        answer = issued.answers[rank]
        answer.last_send = now
        if ok:
            answer.sends += 1
            self.n["commands_sends"] += 1
            if answer.state == "pending":
                answer.state = "sent"
        else:  # no route to the rank yet: tried again after RETRY_S
            self.n["commands_send_failed"] += 1

    def decide(self, now: float) -> list[Issued]:
        """Held commands whose ranks all answered (or the ask timed out): go, move or abort.
        The commands that changed."""
        out = []
        for issued in self._held.values():
            if issued.phase != "ask":
                continue
            answers = issued.answers.values()
            missing = [a for a in answers if a.state in WAITING]
            if missing and now - issued.asked < ASK_TIMEOUT_S:
                continue
            for a in missing:
                why = f"no answer in {ASK_TIMEOUT_S:g} s: the command is aborted for all"
                self._settle(a, "no_ack", why, "command_no_ack")
            bad = [a for a in answers if a.state in ("refused", "failed", "no_ack")]
            late = [a for a in answers if a.state == "late"]
            if bad or (late and issued.moves >= MAX_MOVES):
                issued.phase = "abort"
                why = "a rank refused, failed or did not answer" if bad else "ranks kept passing it"
                issued.reason = f"aborted for every rank: {why}" + (
                    f" ({issued.reason})" if issued.reason else ""
                )
                self.n["commands_aborted"] += 1
                word = "abort"
            elif late:
                top = max((a.step for a in answers if a.step is not None), default=issued.step)
                issued.step = max(issued.step or 0, top or 0) + issued.margin
                issued.moves += 1
                issued.phase, issued.asked = "ask", now
                self.n["commands_moved"] += 1
                word = "move"
            else:
                issued.phase = "go"
                word = "go"
            for a in answers:
                if a.state in ("received", "late"):
                    a.word, a.sends, a.last_send = word, 0, -math.inf
                    if word == "move":
                        a.state = "sent"
            issued.updated = now
            out.append(issued)
        return out

    def answer(self, run: str, rank: int, info: Mapping[str, Any], now: float) -> Issued | None:
        """Apply a rank's ``command`` event; the command it changed, or None."""
        try:
            ack = Ack.from_info(info)
        except CommandError:
            self.n["command_acks_bad"] += 1
            return None
        issued = self._held.get(ack.id)
        if issued is None or issued.run != run or rank not in issued.answers:
            self.n["command_acks_unknown"] += 1
            return None
        self.n["command_acks"] += 1
        answer = issued.answers[rank]
        state = ack.state
        if state == "replayed":
            self.n["command_acks_replayed"] += 1
            if answer.state not in (*WAITING, "no_ack"):
                return None
            state = "received"
        if answer.state == "no_ack":
            self.n["command_acks_after_timeout"] += 1
        if answer.state in ("done", "failed", "refused", "aborted") and state in (
            "received",
            "late",
        ):
            return None  # an earlier answer arriving after a later one
        if issued.hold and ack.at is not None and ack.at != issued.step and state != "aborted":
            return None  # an answer about the step before a move
        if state == "refused":
            self.n["command_refused"] += 1
        answer.state, answer.step, answer.time = state, ack.step, now
        answer.at = ack.at if ack.at is not None else answer.at
        answer.detail = ack.detail
        if answer.word == "cmd" or (answer.word == "move" and state in ("received", "late")):
            answer.word = ""  # heard; what comes next is the phase's word
        elif state in ("done", "failed", "aborted", "refused"):
            answer.word = ""
        if issued.phase == "abort" and state in ("received", "late"):
            answer.word, answer.sends = "abort", 0  # it answered after the others were told
        issued.updated = now
        return issued

    def passed(self, now: float, last_step: Callable[[str, int], int | None]) -> list[Issued]:
        """Ranks told to act at a step that report steps well past it and never said done
        (their loop does not ask ``should_stop``, or the answer was lost): ``failed``, so the
        command settles instead of waiting for ever. ``last_step(run, rank)``: the rank's
        newest step. The commands that changed."""

        def verdict(issued: Issued, rank: int, answer: RankAnswer) -> str | None:
            if issued.step is None or issued.kind == "note" or issued.phase not in ("", "go"):
                return None
            step = last_step(issued.run, rank)
            if answer.state not in ("received", "late") or step is None:
                return None
            if step < issued.step + PASSED_STEPS or step < (answer.at or 0) + PASSED_STEPS:
                return None
            answer.step = step
            return (f"reported step {step} without acting at step {answer.at or issued.step}: "
                    "its loop does not call should_stop(), or the answer was lost")  # fmt: skip

        return self._sweep(now, "failed", "command_not_acted", verdict)

    def expire(self, now: float) -> list[Issued]:
        """Ranks that never answered within ``ACK_TIMEOUT_S`` become ``no_ack``; the commands
        that changed."""

        def verdict(issued: Issued, rank: int, answer: RankAnswer) -> str | None:
            if now - issued.created < ACK_TIMEOUT_S or answer.state not in WAITING:
                return None
            return (f"no answer in {ACK_TIMEOUT_S:g} s after {answer.sends} send(s): the rank "
                    "is gone, unreachable, or its agent predates commands")  # fmt: skip

        return self._sweep(now, "no_ack", "command_no_ack", verdict)

    def _sweep(
        self,
        now: float,
        state: str,
        counter: str,
        verdict: Callable[[Issued, int, RankAnswer], str | None],
    ) -> list[Issued]:
        """Every rank answer ``verdict`` gives a reason for is settled as ``state``; the
        commands that changed."""
        out = []
        for issued in self._held.values():
            changed = False
            for rank, answer in issued.answers.items():
                why = verdict(issued, rank, answer)
                if why is not None:
                    self._settle(answer, state, why, counter)
                    changed = True
            if changed:
                issued.updated = now
                out.append(issued)
        return out

    def _settle(self, answer: RankAnswer, state: str, why: str, counter: str) -> None:
        """The book settles a rank's answer itself (no answer came, or the rank did not act):
        nothing more is sent to the rank, and it is counted."""
        answer.state, answer.word, answer.detail = state, "", why
        self.n[counter] += 1
