"""Cost of the incident tracker per burst of events at 4,096 ranks, how it grows with the
ranks, and whether it names the culprit in every seed; or (``--judging``) its cost per tick
while a fault's evidence keeps arriving, beside another revision's tracker.

    python bench/incidents.py [--ranks 4096] [--repeats 15] [--seeds 20] [--scale 4]
                              [--baseline REV]
    python bench/incidents.py --judging [--sizes 4096,16384,100000] [--ticks 15]
                              [--baseline main]

Bursts, each one ``IncidentTracker.observe`` call on a tracker that already knows every rank:

* ``nan``: the culprit's loss non-finite at step 20, every other rank's at step 21;
* ``crash``: the culprit raises, then every peer fails in AllReduce (MindSpore's wording, the
  rank number in each message so no two are the same string);
* ``hang``: every rank stalled at step 19, with a stack sample each (the culprit in user code, the
  others in the framework's collective); then ``timeouts``, the next burst on that tracker: the
  peers' collective timeouts.

The rank-health input is made the way the service makes it: records fed to a real
``HealthTracker`` and its ``changes()`` handed over as they come (``--form list`` hands a plain
list of the same items instead: the tracker then reads each value's fields).

Median CPU milliseconds per burst over ``--repeats`` fresh trackers, and the ratio against a
bare loop over the same events in the same run (each event put in a dict by rank: the least any
consumer does). Then the same at ``--scale`` times the ranks, per event: a ratio near 1 is
linear. Then ``--seeds`` seeded shuffles of each fault, split over three passes: how many name
the injected rank, and it alone. ``--baseline REV``: the costs of that revision's tracker first
(its incident modules as that revision has them), then this tree's.

``--judging``: the scenarios of ``incident_ticks.py`` (a fault half the ranks reported, then
100 ranks changing state per tick) at each size, median CPU ms per tick over ``--ticks``, this
tree's tracker and ``--baseline``'s (its incident modules as that revision has them) in the
same run, alternating which goes first; their incidents after the last tick must be equal.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from incident_ticks import CHANGED, SCENARIOS, per_tick, tracker_of
from rankwatch.agent.wire.records import EventRecord, Heartbeat, StepRecord
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import HealthTracker, RankHealth
from rankwatch.aggregator.incidents.stacks import Frame, StackSample
from rankwatch.aggregator.incidents.tracker import IncidentTracker

RUN = "bench"
T0 = 1_700_000_000.0
PEER_TEXT = (
    "builtins.RuntimeError: Launch kernel failed, name:Default/network-TrainOneStepCell/"
    "optimizer-Momentum/grad_reducer-DistributedGradReducer/AllReduce-op2 (rank {rank})\n\n"
    + "-" * 52
    + "\n- C++ Call Stack: (For framework developers)\n"
    + "-" * 52
    + "\n"
    + "mindspore/ccsrc/runtime/graph_scheduler/actor/kernel_actor.cc:1133 ExecuteLaunchKernelTask\n"
    * 8
)
IN_COLLECTIVE = (
    Frame("mindspore/common/api.py", 1891, "_exec_pip"),
    Frame("mindspore/train/model.py", 940, "_train_process"),
    Frame("job/train.py", 136, "main"),
)
IN_USER = (Frame("job/train.py", 98, "on_train_step_begin"), *IN_COLLECTIVE[1:])

Events = dict[str, list[Any]]


class Ranks:
    """A real ``HealthTracker`` of ``n`` ranks at step 19; each burst is its ``changes()``."""

    def __init__(self, n: int) -> None:
        self.n, self.seq = n, 0
        self.tracker = HealthTracker()
        for r in range(n):
            rec = StepRecord(RUN, r, 0, T0, n, f"node-{r // 8}", 1000 + r, 19, 0, {"loss": 2.3})
            self.tracker.observe(rec, T0 + (r % 7) * 0.01)
        self.alive = self.tracker.changes(T0 + 1)

    def crash(self, ranks: list[int], at: float, messages: dict[int, tuple[str, str]]) -> None:
        self.seq += 1
        for r in ranks:
            exc, text = messages[r]
            info = {"exc_type": exc, "message": text}
            ev = EventRecord(RUN, r, self.seq, at, self.n, f"node-{r // 8}", 1000 + r, "crash",
                             20, info)  # fmt: skip
            self.tracker.observe(ev, at)

    def beat(self, at: float) -> None:
        for r in range(self.n):
            self.tracker.observe(Heartbeat(RUN, r, 0, at, 19, 5.0, 0), at)

    def changes(self, now: float) -> list[tuple[RankHealth, str]]:
        return self.tracker.changes(now)


def peer_crash(rank: int) -> tuple[str, str]:
    exc, _, text = PEER_TEXT.format(rank=rank).partition(": ")
    return exc, text


def nan(rank: int, step: int) -> Divergence:
    x = float("nan")
    return Divergence(RUN, "loss", rank, "nonfinite", "high", step, step, x, 2.3, x, x, "", 0)


def bursts(n: int, culprit: int, form: str = "columns") -> dict[str, list[Events]]:
    peers = [r for r in range(n) if r != culprit]
    crashes = {r: peer_crash(r) for r in peers}
    crashes[culprit] = ("builtins.RuntimeError", f"injected fault at step 20 (rank {culprit})")
    keep = list if form == "list" else _same
    crashed = Ranks(n)
    crashed.crash([culprit], T0 + 1, crashes)
    crashed.crash(peers, T0 + 30, crashes)
    hung = Ranks(n)  # heard from but stalled past min_stall_s, then the peers' timeouts
    hung.beat(T0 + 44)
    stalls = hung.changes(T0 + 45)
    hung.beat(T0 + 59)
    hung.crash(peers, T0 + 60, crashes)
    return {
        "nan": [{"divergences": [nan(culprit, 20)] + [nan(r, 21) for r in peers]}],
        "crash": [{"health": keep(crashed.changes(T0 + 31))}],
        "hang": [
            {
                "health": keep(stalls),
                "stacks": [
                    StackSample(
                        RUN,
                        r,
                        T0 + 35,
                        19,
                        "user" if r == culprit else "framework",
                        "u" if r == culprit else "f",
                        IN_USER if r == culprit else IN_COLLECTIVE,
                    )
                    for r in range(n)
                ],
            },
            {"health": keep(hung.changes(T0 + 61))},
        ],
    }


def _same(items: list[Any]) -> list[Any]:
    return items


def known(alive: list[Any], tracker_class: type = IncidentTracker) -> IncidentTracker:
    tracker = tracker_class()
    tracker.observe(T0, health=alive)
    return tracker


def bare(events: list[Events]) -> None:
    seen: dict[int, Any] = {}
    for burst in events:
        for items in burst.values():
            for item in items:
                seen[item[0].rank if type(item) is tuple else item.rank] = item


def timed(fn: Callable[[], None]) -> float:
    """Milliseconds of this process's CPU: on a shared machine, wall time counts the waits."""
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1e3


NAMES = {"nan": ["nan"], "crash": ["crash"], "hang": ["hang", "timeouts"]}


def measure(
    n: int, repeats: int, form: str, tracker_class: type = IncidentTracker
) -> list[tuple[str, int, float, float]]:
    """(burst, events, tracker ms, bare loop ms) per burst: medians over fresh trackers."""
    out = []
    alive = Ranks(n).alive
    for fault, events in bursts(n, n // 3, form).items():
        runs: list[list[float]] = [[] for _ in events]
        loops: list[list[float]] = [[] for _ in events]
        for _ in range(repeats):
            tracker = known(alive, tracker_class)
            for i, burst in enumerate(events):
                runs[i].append(timed(lambda t=tracker, b=burst, i=i: replay_one(t, b, i)))
                loops[i].append(timed(lambda b=burst: bare([b])))
        for name, burst, tr, lo in zip(NAMES[fault], events, runs, loops, strict=True):
            count = sum(len(v) for v in burst.values())
            out.append((name, count, statistics.median(tr), statistics.median(lo)))
    return out


def replay_one(tracker: IncidentTracker, burst: Events, i: int) -> None:
    tracker.observe(T0 + 100 + i, **burst)


def cost(
    n: int, repeats: int, scale: int, form: str, tracker_class: type = IncidentTracker, of: str = ""
) -> None:
    print(f"cost per burst at {n} ranks (median of {repeats}; ms; health as {form}){of}")
    print(f"{'burst':8} {'events':>7} {'tracker':>9} {'bare loop':>10} {'ratio':>7}")
    small = measure(n, repeats, form, tracker_class)
    for name, count, tr, lo in small:
        print(f"{name:8} {count:7d} {tr:9.2f} {lo:10.3f} {tr / max(lo, 1e-6):6.0f}x")
    if scale <= 1:
        return
    big = n * scale
    print(f"per event at {n} and {big} ranks (median of {repeats}; us)")
    print(f"{'burst':8} {n:>9} {big:>9} {'growth':>7}")
    for (name, count, tr, _), (_, count_big, tr_big, _) in zip(
        small, measure(big, repeats, form, tracker_class), strict=True
    ):
        per, per_big = tr / count * 1e3, tr_big / count_big * 1e3
        print(f"{name:8} {per:9.2f} {per_big:9.2f} {per_big / max(per, 1e-9):6.2f}x")


def seeds(n: int, count: int) -> None:
    print(f"culprit named right, alone, at {n} ranks, shuffled into 3 passes")
    alive = Ranks(n).alive
    for name in ("nan", "crash", "hang"):
        right = 0
        for seed in range(count):
            rng = random.Random(seed)
            culprit = rng.randrange(n)
            tracker = known(alive)
            for i, burst in enumerate(bursts(n, culprit)[name]):
                items = [(k, v) for k, vs in burst.items() for v in vs]
                rng.shuffle(items)
                for j in range(3):
                    part: Events = {}
                    for k, v in items[j::3]:
                        part.setdefault(k, []).append(v)
                    tracker.observe(T0 + 100 + i * 10 + j, **part)
            incidents = tracker.incidents(RUN)
            right += len(incidents) == 1 and incidents[0].culprits == (culprit,)
        print(f"  {name:6} {right}/{count} seeds")


def judging(sizes: list[int], ticks: int, baseline: str) -> None:
    old = tracker_of(baseline)
    print(f"judging per tick: half the ranks reported a fault, then {CHANGED} ranks changing "
          f"state per tick (median of {ticks} ticks; CPU ms)")  # fmt: skip
    print(f"{'scenario':8} {'ranks':>7} {baseline:>10} {'this tree':>10} {'ratio':>7}")
    for n in sizes:
        for k, name in enumerate(SCENARIOS):
            pair = [(old, "old"), (IncidentTracker, "new")]
            if k % 2:  # which goes first alternates: a loaded machine favours neither
                pair.reverse()
            got = {which: per_tick(cls, name, n, ticks) for cls, which in pair}
            if got["old"][1] != got["new"][1]:
                raise SystemExit(f"{name} at {n} ranks: the incidents differ from {baseline}'s")
            before, after = got["old"][0], got["new"][0]
            print(f"{name:8} {n:7d} {before:10.2f} {after:10.2f} {before / max(after, 1e-6):6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--scale", type=int, default=4, help="also at this many times the ranks")
    parser.add_argument(
        "--form",
        choices=("columns", "list"),
        default="columns",
        help="health as changes() gives it, or as a plain list of its items",
    )
    parser.add_argument("--judging", action="store_true", help="cost per tick, old vs new")
    parser.add_argument("--sizes", default="4096,16384,100000", help="ranks, for --judging")
    parser.add_argument("--ticks", type=int, default=15, help="ticks timed, for --judging")
    parser.add_argument(
        "--baseline", help="revision whose tracker runs first, beside this tree's (--judging: main)"
    )
    args = parser.parse_args()
    if args.judging:
        sizes = [int(x) for x in args.sizes.split(",")]
        if args.ticks < 1 or min(sizes) < 2 * CHANGED * args.ticks:
            parser.error(f"--sizes must be >= {2 * CHANGED} x --ticks, --ticks >= 1")
        judging(sizes, args.ticks, args.baseline or "main")
        return
    if args.baseline:
        cost(args.ranks, args.repeats, args.scale, args.form, tracker_of(args.baseline),
             f" -- {args.baseline}'s tracker")  # fmt: skip
    if args.ranks < 2 or args.repeats < 1 or args.seeds < 0 or not 1 <= args.scale <= 16:
        parser.error("--ranks must be >= 2, --repeats >= 1, --seeds >= 0, --scale 1-16")
    cost(args.ranks, args.repeats, args.scale, args.form)
    seeds(args.ranks, args.seeds)


if __name__ == "__main__":
    main()
