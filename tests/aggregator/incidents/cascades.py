"""Faults that spread to every rank, as the tracker's inputs with seeded noise, delivered in
ticks of the aggregator's loop (``now`` passed in; nothing sleeps).

Each scenario draws from its seed: the culprit rank, the onset step, when each rank's evidence
arrives (its record's time plus a transport delay; the culprit's may come late, after its
peers' later evidence), how long the peers wait and how spread their failures are, where the
hung rank is, which of the peers' stack samples arrived, and which framework's wording the
crashes carry (the fixtures of ``tests/fixtures/crashes``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.hold import AnnounceHold
from rankwatch.aggregator.incidents.model import IncidentChange
from rankwatch.aggregator.incidents.tracker import IncidentConfig, IncidentTracker

from tests.aggregator.incidents.builders import (
    IN_ALLREDUCE,
    IN_SLEEP,
    RUN,
    T0,
    crash_text,
    crashed,
    health,
    nan,
    stack,
)

TICK_S = 0.2  # the aggregator's loop period
STEP_S = 0.2  # seconds per training step
STALL_AFTER_S = 2.0  # health calls a rank stalled after this long without a step
PEER_TEXTS = (
    "mindspore_allreduce_kernel.txt", "mindspore_hccl_timeout.txt",
    "mindspore_gloo_peer_closed.txt", "msrun_demo_hang_peer_allreduce.txt",
    "torch_gloo_timeout.txt", "torch_nccl_watchdog.txt", "torch_nccl_system_error.txt",
    "torchrun_demo_crash_peer_gloo.txt",
)  # fmt: skip
CULPRIT_TEXTS = ("user_valueerror.txt", "torch_cuda_oom.txt")
IN_LOADER = [
    ("mindspore/dataset/engine/iterators.py", 150, "_get_next"),
    ("mindspore/train/dataset_helper.py", 412, "__next__"),
    ("mindspore/train/model.py", 925, "_train_process"),
    ("job/train.py", 136, "main"),
]
OUTSIDE = {"dataloader": IN_LOADER, "sleep": IN_SLEEP, "user": IN_SLEEP[:1] + IN_LOADER[2:]}
CAUSES = {"nan": "nonfinite", "hang": "hang", "crash": "crash"}

Timed = tuple[float, str, Any]  # (arrival time, observe keyword, value)


@dataclass(frozen=True)
class Cascade:
    scenario: str
    seed: int
    world: int
    culprit: int
    onset: int  # the fault step
    items: list[Timed]

    @property
    def cause(self) -> str:
        return CAUSES[self.scenario]


def cascade(scenario: str, seed: int, world: int = 1024) -> Cascade:
    rng = random.Random(f"{scenario}:{seed}")
    culprit = rng.randrange(world)
    onset = rng.randint(8, 12)
    t_fault = T0 + onset * STEP_S
    lag = rng.choice((0.0, 0.0, 0.4, 1.0))  # the culprit's evidence arrives this much later
    jitter = rng.uniform(0.05, 0.6)  # transport and clock spread of the others'
    peers = [r for r in range(world) if r != culprit]
    items: list[Timed] = []
    if scenario == "nan":
        items.append((t_fault + STEP_S + lag, "divergences", nan(culprit, onset)))
        for r in peers:
            at = t_fault + 2 * STEP_S + rng.uniform(0, jitter)
            items.append((at, "divergences", nan(r, onset + 1)))
        return Cascade(scenario, seed, world, culprit, onset, items)
    last = onset - 1  # every rank finished this step before it waited
    text = crash_text(rng.choice(PEER_TEXTS))
    if scenario == "hang":
        wait = rng.uniform(STALL_AFTER_S + 1.0, STALL_AFTER_S + 4.0)
        where = rng.choice(sorted(OUTSIDE))
        kept = rng.uniform(0.6, 1.0)  # share of the peers whose stack sample arrived in time
        for r in range(world):
            stalled = (
                t_fault + STALL_AFTER_S + rng.uniform(0, jitter) + (lag if r == culprit else 0)
            )
            items.append((stalled, "health", health(r, RankState.STALLED, world=world, step=last,
                                                     since=stalled)))  # fmt: skip
            sampled = t_fault + 1.0 + rng.uniform(0, 1.0) + (lag if r == culprit else 0)
            if r == culprit:
                frames, place = OUTSIDE[where], where
            elif rng.random() < kept:
                frames, place = IN_ALLREDUCE, "framework"
            else:
                continue
            items.append((sampled, "stacks", stack(r, place, frames, time=sampled, step=last)))
    else:
        wait = rng.uniform(0.5, STALL_AFTER_S + 1.0)
        at = t_fault + lag
        items.append((at, "health", crashed(culprit, crash_text(rng.choice(CULPRIT_TEXTS)),
                                             world=world, since=at, step=last)))  # fmt: skip
    spread = rng.uniform(0.2, 1.5)
    latest = t_fault
    for r in peers:
        at = t_fault + wait + rng.uniform(0, spread)
        latest = max(latest, at)
        items.append((at, "health", _peer_crash(r, text, world, at, last)))
    if scenario == "hang":
        at = latest + 1.0  # the launcher kills the hung rank once the peers are gone
        term = health(culprit, RankState.FINISHED, world=world, step=last, since=at,
                      message="finished (SIGTERM)")  # fmt: skip
        items.append((at, "health", term))
    return Cascade(scenario, seed, world, culprit, onset, items)


def _peer_crash(rank: int, text: str, world: int, at: float, step: int) -> Any:
    return crashed(rank, text.removeprefix("crashed: builtins."), world=world, since=at, step=step)


def play(
    c: Cascade, tracker: IncidentTracker | None = None, hold: AnnounceHold | None = None
) -> tuple[IncidentTracker, list]:
    """Every rank seen alive, then the cascade's items tick by tick, shuffled within a tick
    (seeded); returns the tracker and every incident change, or with ``hold`` the
    announcements as (now, change) pairs (ticks go on until nothing is held)."""
    tracker = tracker or IncidentTracker()
    tracker.observe(T0, health=[health(r, world=c.world, step=c.onset - 1) for r in range(c.world)])
    rng = random.Random(f"{c.scenario}:{c.seed}:order")
    items = sorted(c.items, key=lambda item: item[0])
    changes: list[IncidentChange] = []
    told: list[tuple[float, IncidentChange]] = []
    now, i = T0, 0
    while i < len(items) or (hold is not None and len(hold)):
        now += TICK_S
        batch: dict[str, list[Any]] = {}
        due = []
        while i < len(items) and items[i][0] <= now:
            due.append(items[i])
            i += 1
        rng.shuffle(due)
        for _, key, value in due:
            batch.setdefault(key, []).append(value)
        passed = tracker.observe(now, **batch)
        changes += passed
        if hold is not None:
            told += [(now, change) for change in hold.due(now, passed)]
    return tracker, told if hold is not None else changes


def wrong(c: Cascade, tracker: IncidentTracker) -> str:
    """ "" when the run has one incident of the scenario's cause, the culprit alone named, every
    other rank affected; else what was wrong."""
    incidents = tracker.incidents(RUN)
    if len(incidents) != 1:
        return f"{len(incidents)} incidents: {[(i.cause, i.culprits[:4]) for i in incidents]}"
    (inc,) = incidents
    if inc.culprits != (c.culprit,) or inc.cause != c.cause:
        return f"{inc.cause} culprits {inc.culprits[:8]}: {inc.summary[:200]}"
    if len(inc.affected) != c.world - 1:
        return f"{len(inc.affected)} affected: {inc.summary[:200]}"
    return ""


def main() -> None:
    """``python -m tests.aggregator.incidents.cascades [seeds] [world] [quiet_s] [hold_s]``:
    counts per scenario; the first announcement right without the hold and with it
    (``IncidentConfig``'s defaults unless given), and the time the hold added to it."""
    import statistics
    import sys

    args = sys.argv[1:]
    seeds = int(args[0]) if args else 100
    world = int(args[1]) if len(args) > 1 else 1024
    defaults = IncidentConfig()
    quiet = float(args[2]) if len(args) > 2 else defaults.announce_quiet_s
    most = float(args[3]) if len(args) > 3 else defaults.announce_hold_s
    for scenario in CAUSES:
        right = 0
        firsts, updates = [0, 0], [0, 0]  # without the hold, with it
        added: list[float] = []
        for seed in range(seeds):
            c = cascade(scenario, seed, world)
            tracker, now = play(c, hold=AnnounceHold(0.0, 0.0))
            right += not wrong(c, tracker)
            _, held = play(c, hold=AnnounceHold(quiet, most))
            for i, told in enumerate((now, held)):
                inc = next(ch for _, ch in told if ch.change == "opened").incident
                firsts[i] += inc.culprits == (c.culprit,) and inc.cause == c.cause
                updates[i] += sum(ch.change == "updated" for _, ch in told)
            opened = [next(t for t, ch in told if ch.change == "opened") for told in (now, held)]
            added.append(opened[1] - opened[0])
        added.sort()
        p95 = added[min(len(added) - 1, round(0.95 * (len(added) - 1)))]
        print(
            f"{scenario:6} {right}/{seeds} seeds right; first announcement right in "
            f"{firsts[0]}, {updates[0]} updates; held (quiet {quiet:g} s, at most {most:g} s): "
            f"{firsts[1]}, {updates[1]} updates, {statistics.median(added):.1f} s later median, "
            f"{p95:.1f} s p95"
        )


if __name__ == "__main__":
    main()
