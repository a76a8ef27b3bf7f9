"""What a rank does with the aggregator's commands (``wire/commands.py``): checkpoint, stop, note.

The sender thread hands each command map to ``Commands.receive``; the training thread asks
``poll(step)`` at its step ends (``Monitor.should_stop``, the MindSpore callback). Nothing here
touches a socket: acknowledgements go out through ``emit`` (the Monitor's ``command`` event).

A rank acts only on the kinds it opted into (``accept``; default none). Each command id is
acted on once (``SEEN_MAX`` ids remembered); a repeat is acknowledged ``replayed``. A
checkpoint or stop names a step: at the first step end at or past it, the checkpoint handlers
run (on the training thread, where the model may be touched) and then a due stop makes
``poll`` return True from then on. The aggregator gives every rank the same step, ahead of
the highest any rank reported, so in synchronous training every rank ends after the same
step and no collective waits for a rank that left.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .wire.commands import COMMAND_KINDS, Ack, Command, CommandError, check_id

log = logging.getLogger("rankwatch.agent")

SEEN_MAX = 1024  # command ids remembered, to act on each once
DUE_MAX = 64  # checkpoints and stops waiting for their step; more are refused

Handler = Callable[[int], Any]  # called with the step; a checkpoint's return value: its path


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
        self._due: list[Command] = []
        self._lock = threading.Lock()
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
        with self._lock:
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
        with self._lock:
            if len(self._due) >= DUE_MAX:
                full = True
            else:
                full = False
                self._due.append(cmd)
                self.next_at = min(c.step for c in self._due if c.step is not None)
        if full:
            self._answer(cmd, "refused", last_step, f"{DUE_MAX} commands already wait")
            return
        # past it only once its step end was asked about (a loop that calls poll), else once
        # it logged a later step
        done = self.polled if self.polled is not None else last_step
        late = done is not None and cmd.step is not None and done >= cmd.step
        self.counts["received"] += 1
        log.warning(
            "rankwatch: %s requested by %s at the end of step %s%s",
            cmd.kind,
            cmd.by or "the aggregator",
            cmd.step,
            f" (already past it at {last_step}: at the next step end)" if late else "",
        )
        self._answer(cmd, "late" if late else "received", last_step, "", count=False)

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
        with self._lock:
            if cmd.id in self._seen:
                self._seen[cmd.id] = state
        if state == "refused" and detail:
            log.warning("rankwatch: refused %s from %s: %s", cmd.kind, cmd.by or "?", detail)
        self._emit(Ack(cmd.id, cmd.kind, state, step, cmd.step, detail))

    # --- the training thread ------------------------------------------------------------

    def poll(self, step: int | None) -> bool:
        """At a step end: run what is due by ``step`` (checkpoints, then stops); True once
        this rank is to stop."""
        self.polled = step
        at = self.next_at
        if at is None or step is None or step < at:
            return self.stopping
        with self._lock:
            due = [c for c in self._due if c.step is not None and c.step <= step]
            self._due = [c for c in self._due if c not in due]
            self.next_at = min((c.step for c in self._due if c.step is not None), default=None)
        due.sort(key=lambda c: (c.kind != "checkpoint", c.step))  # checkpoint before stop
        for cmd in due:
            self._run_handlers(cmd, step)
            if cmd.kind == "stop" and not self.stopping:
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
