"""Faults that spread, for the load generator: one rank's fault reaches every rank, as in
synchronous data parallelism, with seeded noise. Pure: ticks in, records' parts out.

=============== ======================================================================
kind            from the onset step ``K`` on
=============== ======================================================================
``nanspread``   the rank's loss is NaN from step K, every rank's from K + 1 (the
                all-reduce spreads it)
``hangwait``    the rank hangs at the start of step K, its main thread outside the
                framework (``Noise.where``: the data loader, a sleep, user code); every
                peer waits in step K's all-reduce. All keep sending heartbeats (stack
                samples once stalled); ``magnitude`` s later the peers fail with a
                collective timeout (``Noise.peer_text``), then the launcher kills the
                rank (an ``end`` event, reason SIGTERM)
``crashwait``   the rank raises at step K (``Noise.culprit_text``); every peer waits in
                step K's all-reduce and fails ``magnitude`` s later in it
=============== ======================================================================

Noise, all drawn from the run's seed: each rank's clock is off by up to ``jitter_s``; the
culprit's records leave ``lag_ticks`` ticks late (so peers' later records arrive before them);
peers fail spread over ``spread_s``; each tick's records go out in a shuffled order.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

CASCADE_KINDS = ("nanspread", "hangwait", "crashwait")
DEFAULT_WAIT_S = 4.0  # hangwait/crashwait: seconds from the onset to the peers' failures
STACK_AFTER_S = 1.0  # a stalled rank's heartbeats carry a stack sample after this long
KILL_AFTER_S = 1.0  # hangwait: the launcher kills the culprit this long after the last peer
WHERES = ("dataloader", "sleep", "user")

# Where the ranks are while they wait (innermost first), as the agent reports it.
IN_ALLREDUCE = (
    ("mindspore/common/api.py", 1891, "_exec_pip"),
    ("mindspore/nn/wrap/grad_reducer.py", 310, "AllReduce"),
    ("mindspore/train/model.py", 940, "_train_process"),
    ("job/train.py", 136, "main"),
)
OUTSIDE = {
    "dataloader": (
        ("mindspore/dataset/engine/iterators.py", 150, "_get_next"),
        ("mindspore/train/dataset_helper.py", 412, "__next__"),
        ("mindspore/train/model.py", 925, "_train_process"),
        ("job/train.py", 136, "main"),
    ),
    "sleep": (
        ("job/train.py", 98, "on_train_step_begin"),
        ("mindspore/train/callback/_callback.py", 420, "on_train_step_begin"),
        ("mindspore/train/model.py", 930, "_train_process"),
        ("job/train.py", 136, "main"),
    ),
    "user": (
        ("job/augment.py", 51, "mix_batch"),
        ("job/train.py", 77, "transform"),
        ("mindspore/train/model.py", 925, "_train_process"),
        ("job/train.py", 136, "main"),
    ),
}


@dataclass(frozen=True)
class Noise:
    jitter_s: float = 0.0
    lag_ticks: int = 0
    spread_s: float = 0.0
    shuffle: bool = False
    peer_text: str = "RuntimeError: Launch kernel failed: Default/AllReduce-op2"
    culprit_text: str = "ValueError: label 7 out of range for 5 classes"
    where: str = "dataloader"

    def check(self) -> None:
        if not (self.jitter_s >= 0 and self.spread_s >= 0 and self.lag_ticks >= 0):
            raise ValueError("noise: jitter_s, spread_s and lag_ticks must be >= 0")
        if self.where not in WHERES:
            raise ValueError(f"noise: where must be one of {', '.join(WHERES)}")


def exception_of(text: str) -> tuple[str, str]:
    """``(exc_type, message)`` as the agent's crash event carries them, from a crash text:
    ``Type: message``, a whole traceback (its last exception line), or health's own
    ``crashed: builtins.Type: message`` wording."""
    text = text.strip().removeprefix("crashed: ")
    if text.startswith("Traceback"):  # from the exception line on: its type and str(exc)
        lines = text.splitlines()
        at = next((i for i, ln in enumerate(lines) if i and ln and not ln[0].isspace()), 0)
        text = "\n".join(lines[at:])
    kind, sep, rest = text.partition(": ")
    if not sep or " " in kind or "[" in kind:  # a log line (NCCL's watchdog), not "Type: text"
        return "torch.distributed.DistBackendError", text
    return _qualified(kind), rest


def _qualified(kind: str) -> str:
    return kind if "." in kind else f"builtins.{kind}"


class Cascade:
    """The schedule of the cascade faults of one run, per tick (a tick is one step's time)."""

    def __init__(self, world: int, rate: float, seed: int, faults: list[Any], noise: Noise) -> None:
        self.rate, self.noise = rate, noise
        rng = random.Random(f"{seed}:cascade")
        self.offset = [rng.uniform(-noise.jitter_s, noise.jitter_s) for _ in range(world)]
        self.stop = 0  # every rank sends no step record from this tick (0: none)
        self.events: dict[int, dict[int, tuple[str, int | None, dict[str, Any]]]] = {}
        self.hung: dict[int, tuple[int, str]] = {}  # hangwait culprit -> (onset, where)
        self.lagged: dict[int, int] = {}  # rank -> ticks its records are held back
        for f in faults:
            if f.kind not in CASCADE_KINDS:
                continue
            if noise.lag_ticks:
                self.lagged[f.rank] = noise.lag_ticks
            if f.kind == "nanspread":  # the values are the model's (loadgen.Model)
                continue
            wait = f.magnitude if f.magnitude is not None else DEFAULT_WAIT_S
            self.stop = f.step if not self.stop else min(self.stop, f.step)
            fail_at = f.step + wait * rate
            exc, message = exception_of(noise.peer_text)
            last = f.step - 1  # the step every rank finished before it waits
            latest = fail_at
            for r in range(world):
                if r == f.rank:
                    continue
                at = fail_at + rng.uniform(0, noise.spread_s) * rate
                latest = max(latest, at)
                info = {"exc_type": exc, "message": message, "fatal": True}
                self.events.setdefault(round(at), {})[r] = ("crash", last, info)
            if f.kind == "crashwait":
                exc, message = exception_of(noise.culprit_text)
                info = {"exc_type": exc, "message": message, "fatal": True}
                self.events.setdefault(f.step, {})[f.rank] = ("crash", last, info)
            else:
                self.hung[f.rank] = (f.step, noise.where)
                kill = round(latest + KILL_AFTER_S * rate)
                self.events.setdefault(kill, {})[f.rank] = ("end", last, {"reason": "SIGTERM"})

    def stepping(self, tick: int) -> bool:
        return not self.stop or tick < self.stop

    def event(self, rank: int, tick: int) -> tuple[str, int | None, dict[str, Any]] | None:
        at = self.events.get(tick)
        return at.get(rank) if at else None

    def stack(self, rank: int, tick: int, now: float) -> dict[str, Any] | None:
        """The stack sample a stalled rank's heartbeat carries, or None."""
        if not self.stop or tick < self.stop + STACK_AFTER_S * self.rate:
            return None
        stalled = (tick - self.stop) / self.rate
        where = self.hung[rank][1] if rank in self.hung else "framework"
        frames = OUTSIDE[where] if where != "framework" else IN_ALLREDUCE
        return {
            "where": where, "signature": signature(frames), "step": self.stop - 1,
            "time": now, "stalled_s": stalled, "note": "",
            "frames": [list(f) for f in frames],
        }  # fmt: skip


def signature(frames: tuple[tuple[str, int, str], ...]) -> str:
    """A stable short hash of the frames' (file, function) pairs, lines left out."""
    text = "|".join(f"{file}:{func}" for file, _, func in frames)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
