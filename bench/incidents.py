"""Cost of the incident tracker per burst of events at 4,096 ranks, how it grows with the
ranks, and whether it names the culprit in every seed.

    python bench/incidents.py [--ranks 4096] [--repeats 15] [--seeds 20] [--scale 4]

Bursts, each one ``IncidentTracker.observe`` call on a tracker that already knows every rank:

* ``nan``: the culprit's loss non-finite at step 20, every other rank's at step 21;
* ``crash``: the culprit raises, then every peer fails in AllReduce (MindSpore's wording, the
  rank number in each message so no two are the same string);
* ``hang``: every rank stalled at step 19, with a stack sample each (the culprit in user code, the
  others in the framework's collective); then ``timeouts``, the next burst on that tracker: the
  peers' collective timeouts.

Median CPU milliseconds per burst over ``--repeats`` fresh trackers, and the ratio against a
bare loop over the same events in the same run (each event put in a dict by rank: the least any
consumer does). Then the same at ``--scale`` times the ranks, per event: a ratio near 1 is
linear. Then ``--seeds`` seeded shuffles of each fault, split over three passes: how many name
the injected rank, and it alone.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankHealth, RankState
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


def health(n: int, rank: int, state: RankState, since: float, message: str = "") -> RankHealth:
    return RankHealth(
        RUN, rank, state, f"node-{rank // 8}", 1000 + rank, n, 19, since, T0 - 60, message, 0,
        0.1, since, None, T0 + (rank % 7) * 0.01,
    )  # fmt: skip


def nan(rank: int, step: int) -> Divergence:
    x = float("nan")
    return Divergence(RUN, "loss", rank, "nonfinite", "high", step, step, x, 2.3, x, x, "", 0)


def bursts(n: int, culprit: int) -> dict[str, list[Events]]:
    peers = [r for r in range(n) if r != culprit]
    crash = f"crashed: builtins.RuntimeError: injected fault at step 20 (rank {culprit})"
    timeouts = [health(n, r, RankState.CRASHED, T0 + 60, PEER_TEXT.format(rank=r)) for r in peers]
    return {
        "nan": [{"divergences": [nan(culprit, 20)] + [nan(r, 21) for r in peers]}],
        "crash": [
            {
                "health": [health(n, culprit, RankState.CRASHED, T0 + 1, crash)]
                + [
                    health(n, r, RankState.CRASHED, T0 + 30, PEER_TEXT.format(rank=r))
                    for r in peers
                ]
            }
        ],
        "hang": [
            {
                "health": [health(n, r, RankState.STALLED, T0 + 30) for r in range(n)],
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
            {"health": timeouts},
        ],
    }


def known(n: int) -> IncidentTracker:
    tracker = IncidentTracker()
    tracker.observe(T0, health=[health(n, r, RankState.ALIVE, T0) for r in range(n)])
    return tracker


def bare(events: list[Events]) -> None:
    seen: dict[int, Any] = {}
    for burst in events:
        for items in burst.values():
            for item in items:
                seen[item.rank] = item


def timed(fn: Callable[[], None]) -> float:
    """Milliseconds of this process's CPU: on a shared machine, wall time counts the waits."""
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1e3


NAMES = {"nan": ["nan"], "crash": ["crash"], "hang": ["hang", "timeouts"]}


def measure(n: int, repeats: int) -> list[tuple[str, int, float, float]]:
    """(burst, events, tracker ms, bare loop ms) per burst: medians over fresh trackers."""
    out = []
    for fault, events in bursts(n, n // 3).items():
        runs: list[list[float]] = [[] for _ in events]
        loops: list[list[float]] = [[] for _ in events]
        for _ in range(repeats):
            tracker = known(n)
            for i, burst in enumerate(events):
                runs[i].append(timed(lambda t=tracker, b=burst, i=i: replay_one(t, b, i)))
                loops[i].append(timed(lambda b=burst: bare([b])))
        for name, burst, tr, lo in zip(NAMES[fault], events, runs, loops, strict=True):
            count = sum(len(v) for v in burst.values())
            out.append((name, count, statistics.median(tr), statistics.median(lo)))
    return out


def replay_one(tracker: IncidentTracker, burst: Events, i: int) -> None:
    tracker.observe(T0 + 100 + i, **burst)


def cost(n: int, repeats: int, scale: int) -> None:
    print(f"cost per burst at {n} ranks (median of {repeats}; ms)")
    print(f"{'burst':8} {'events':>7} {'tracker':>9} {'bare loop':>10} {'ratio':>7}")
    small = measure(n, repeats)
    for name, count, tr, lo in small:
        print(f"{name:8} {count:7d} {tr:9.2f} {lo:10.3f} {tr / max(lo, 1e-6):6.0f}x")
    if scale <= 1:
        return
    big = n * scale
    print(f"per event at {n} and {big} ranks (median of {repeats}; us)")
    print(f"{'burst':8} {n:>9} {big:>9} {'growth':>7}")
    for (name, count, tr, _), (_, count_big, tr_big, _) in zip(
        small, measure(big, repeats), strict=True
    ):
        per, per_big = tr / count * 1e3, tr_big / count_big * 1e3
        print(f"{name:8} {per:9.2f} {per_big:9.2f} {per_big / max(per, 1e-9):6.2f}x")


def seeds(n: int, count: int) -> None:
    print(f"culprit named right, alone, at {n} ranks, shuffled into 3 passes")
    for name in ("nan", "crash", "hang"):
        right = 0
        for seed in range(count):
            rng = random.Random(seed)
            culprit = rng.randrange(n)
            tracker = known(n)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--scale", type=int, default=4, help="also at this many times the ranks")
    args = parser.parse_args()
    if args.ranks < 2 or args.repeats < 1 or args.seeds < 0 or not 1 <= args.scale <= 16:
        parser.error("--ranks must be >= 2, --repeats >= 1, --seeds >= 0, --scale 1-16")
    cost(args.ranks, args.repeats, args.scale)
    seeds(args.ranks, args.seeds)


if __name__ == "__main__":
    main()
