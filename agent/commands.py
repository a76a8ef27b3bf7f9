"""What a rank does with the aggregator's commands (``wire/commands.py``): checkpoint, stop, note.

The sender thread hands each command map to ``Commands.receive``; the training thread asks
``poll(step)`` at its step ends (``Monitor.should_stop``, the MindSpore callback). Nothing here
touches a socket: acknowledgements go out through ``emit`` (the Monitor's ``command`` event).

A rank acts only on the kinds it opted into (``accept``; default none). Each command id is
acted on once (``SEEN_MAX`` ids remembered); a repeat is acknowledged ``replayed``. A
checkpoint or stop names a step: at the first step end at or past it, the checkpoint handlers
run (on the training thread, where the model may be touched) and then a due stop makes
``poll`` return True from then on. The aggregator gives every rank the same step, ahead of
the highest any rank reported, and holds it (``wire/commands.py``): a rank acts at that step
only after the aggregator's ``go``, which comes once every rank said it can still reach the
step; a ``move`` names a later one, an ``abort`` cancels. A rank at the step before the word
waits for it (``HOLD_MAX_S`` at most, then goes on without acting), so in synchronous training
every rank ends after the same step, or none does, and no collective waits for a rank that left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .wire import commands as wire
from .wire.commands import COMMAND_KINDS, DECISIONS, Ack, Command, CommandError, check_id

log = logging.getLogger("rankwatch.agent")

SEEN_MAX = 1024  # command ids remembered, to act on each once
DUE_MAX = 64  # checkpoints and stops waiting for their step; more are refused

Handler = Callable[[int], Any]  # called with the step; a checkpoint's return value: its path


@dataclass
class _Due:
    cmd: Command
    step: int
    go: bool  # may act at ``step`` (not held, or the aggregator said go)


class Commands:
    """One rank's command state. ``counts``: received, refused, replayed, done, failed."""

    def __init__(
        self,
        run: str,
        rank: int,
        inc: int,
        accept: frozenset[str],
        emit: Callable[[Ack], None],
    ) -> None:
        self.run, self.rank, self.inc = run, rank, inc
        self.accept = accept
        self._emit = emit
        self._handlers: dict[str, list[Handler]] = {kind: [] for kind in COMMAND_KINDS}
        self._seen: OrderedDict[str, str] = OrderedDict()  # id -> its latest ack state
        self._due: dict[str, _Due] = {}
        self._cond = threading.Condition()
        self.next_at: int | None = None  # the lowest step a due command names (a cheap check)
        self.stopping = False
        self.stop_step: int | None = None  # the step after which this rank stopped
        self.polled: int | None = None  # the last step poll() was asked about
        self.counts = {"received": 0, "refused": 0, "replayed": 0, "done": 0, "failed": 0}
        self._warned: set[str] = set()

    def on(self, kind: str, fn: Handler) -> None:
        if kind not in COMMAND_KINDS:
            raise ValueError(f"on({kind!r}): commands are {', '.join(COMMAND_KINDS)}")
        if not callable(fn):
            raise ValueError(f"on({kind!r}, ...): {fn!r} is not callable")
        self._handlers[kind].append(fn)

    # --- the sender thread --------------------------------------------------------------

    def receive(self, raw: Mapping[str, Any], last_step: int | None) -> None:
        try:
            cmd = Command.from_wire(raw)
        except CommandError as exc:
            self._refuse_malformed(raw, exc)
            return
        if cmd.inc and self.inc and cmd.inc != self.inc:
            return  # meant for an earlier process of this rank, as resend requests are
        if cmd.run != self.run or cmd.rank != self.rank:
            self._answer(cmd, "refused", last_step,
                         f"meant for run {cmd.run!r} rank {cmd.rank}; this is run "
                         f"{self.run!r} rank {self.rank}")  # fmt: skip
            return
        if cmd.kind in DECISIONS:
            self._decided(cmd, last_step)
            return
        with self._cond:
            state = self._seen.get(cmd.id)
            if state is None:
                self._seen[cmd.id] = "received"
                while len(self._seen) > SEEN_MAX:
                    self._seen.popitem(last=False)
        if state is not None:
            self.counts["replayed"] += 1
            self._emit(Ack(cmd.id, cmd.kind, "replayed", last_step, cmd.step, f"already {state}"))
            return
        if cmd.kind not in self.accept:
            accepted = ", ".join(sorted(self.accept)) or "none"
            self._answer(cmd, "refused", last_step,
                         f"this rank did not opt into {cmd.kind!r} (it accepts: {accepted}; "
                         "Monitor(accept=...) or RANKWATCH_ACCEPT)")  # fmt: skip
            return
        if cmd.kind == "checkpoint" and not self._handlers["checkpoint"]:
            self._answer(cmd, "refused", last_step,
                         "no checkpoint handler on this rank (Monitor.on('checkpoint', fn), or "
                         "the framework callback's)")  # fmt: skip
            return
        if cmd.kind == "note":
            log.warning("rankwatch: note from the aggregator (%s): %s", cmd.by or "?", cmd.text)
            self._run_handlers(cmd, last_step or 0)
            return
        assert cmd.step is not None  # checked by Command for checkpoint and stop
        with self._cond:
            full = len(self._due) >= DUE_MAX
            if not full:
                self._due[cmd.id] = _Due(cmd, cmd.step, go=not cmd.hold)
                self._reschedule()
        if full:
            self._answer(cmd, "refused", last_step, f"{DUE_MAX} commands already wait")
            return
        self.counts["received"] += 1
        late = self._past(cmd.step, last_step)
        log.warning("rankwatch: %s requested by %s at the end of step %s%s", cmd.kind,
                    cmd.by or "the aggregator", cmd.step,
                    f" (already past it at {self.polled}: at the next step end)" if late and
                    not cmd.hold else "")  # fmt: skip
        self._answer(cmd, "late" if late else "received", last_step, "", count=False)

    def _past(self, step: int, last_step: int | None) -> bool:
        """Has this rank gone past the end of ``step``? Once its step end was polled (a loop
        that calls poll), else once it logged a later step."""
        done = self.polled if self.polled is not None else last_step
        return done is not None and done >= step

    def _decided(self, word: Command, last_step: int | None) -> None:
        """``go``, ``move`` or ``abort`` for a held command."""
        with self._cond:
            due = self._due.get(word.id)
            if due is None:  # acted on, aborted, timed out, or never held here: nothing to do
                return
            if word.kind == "go" and word.step == due.step:
                due.go = True
            elif word.kind == "move" and word.step is not None:
                due.step, due.go = word.step, False
                due.cmd = replace(due.cmd, step=word.step)
            elif word.kind == "abort":
                del self._due[word.id]
            self._reschedule()
            self._cond.notify_all()
        cmd = due.cmd
        if word.kind == "move":
            late = self._past(due.step, last_step)
            self._emit(Ack(cmd.id, cmd.kind, "late" if late else "received", last_step,
                           due.step, f"moved to step {due.step}"))  # fmt: skip
        elif word.kind == "abort":
            log.warning("rankwatch: %s %s aborted by the aggregator: %s", cmd.kind, cmd.id,
                        word.text or "no reason given")  # fmt: skip
            self._answer(cmd, "aborted", last_step, word.text or "aborted by the aggregator")

    def _reschedule(self) -> None:
        self.next_at = min((d.step for d in self._due.values()), default=None)

    def _refuse_malformed(self, raw: Mapping[str, Any], exc: CommandError) -> None:
        self.counts["refused"] += 1
        if exc.reason not in self._warned:
            self._warned.add(exc.reason)
            log.warning("rankwatch: refused a command from the aggregator: %s", exc)
        ident = raw.get("id") if isinstance(raw, Mapping) else None
        try:
            check_id(ident)
        except CommandError:
            return  # nothing to answer to
        kind = raw.get("cmd")
        kind = kind[:32] if isinstance(kind, str) else "?"
        self._emit(Ack(str(ident), kind, "refused", None, None, str(exc)))

    def _answer(
        self, cmd: Command, state: str, step: int | None, detail: str, count: bool = True
    ) -> None:
        if count and state in self.counts:
            self.counts[state] += 1
        with self._cond:
            if cmd.id in self._seen:
                self._seen[cmd.id] = state
        if state == "refused" and detail:
            log.warning("rankwatch: refused %s from %s: %s", cmd.kind, cmd.by or "?", detail)
        self._emit(Ack(cmd.id, cmd.kind, state, step, cmd.step, detail))

    # --- the training thread ------------------------------------------------------------

    def poll(self, step: int | None) -> bool:
        """At a step end: run what is due by ``step`` (checkpoints, then stops); True once
        this rank is to stop. A held command due here waits for the aggregator's word."""
        self.polled = step
        at = self.next_at
        if at is None or step is None or step < at:
            return self.stopping
        deadline = time.monotonic() + wire.HOLD_MAX_S
        with self._cond:
            while True:
                due = [d for d in self._due.values() if d.step <= step]
                left = deadline - time.monotonic()
                if all(d.go for d in due) or left <= 0:
                    break
                self._cond.wait(left)
            for d in due:
                del self._due[d.cmd.id]
            self._reschedule()
        ready = sorted((d for d in due if d.go), key=lambda d: d.cmd.kind != "checkpoint")
        for d in due:
            if not d.go:
                self._answer(d.cmd, "failed", step,
                             f"no word from the aggregator within {wire.HOLD_MAX_S:g} s at "
                             f"step {d.step}: not acted on, so no rank leaves alone")  # fmt: skip
        for d in ready:
            self._run_handlers(d.cmd, step)
            if d.cmd.kind == "stop" and not self.stopping:
                self.stopping = True
                self.stop_step = step
        return self.stopping

    def _run_handlers(self, cmd: Command, step: int) -> None:
        results: list[str] = []
        for fn in self._handlers[cmd.kind]:
            try:
                result = fn(cmd.text if cmd.kind == "note" else step)  # type: ignore[arg-type]
            except Exception as exc:  # a failed checkpoint is told, never raised into training
                log.exception("rankwatch: the %s handler %r failed", cmd.kind, fn)
                self._answer(cmd, "failed", step, f"{type(exc).__name__}: {exc}")
                return
            if result is not None:
                results.append(str(result))
        if cmd.kind == "stop":
            detail = f"stopping after step {step}"
        elif cmd.kind == "checkpoint":
            detail = "saved " + ", ".join(results) if results else "saved"
        else:
            detail = "logged"
        self._answer(cmd, "done", step, detail)
