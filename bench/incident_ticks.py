"""The incident tracker's judging per tick while a fault's evidence keeps arriving, for
``bench/incidents.py --judging``; and the tracker of another revision, to run beside this one.

A scenario is a run of N ranks the tracker knows, a fault that half of them have reported
already (the setup, not timed), then ticks of ``CHANGED`` ranks each (timed, one
``IncidentTracker.observe`` per tick, 0.2 s apart):

* ``lost``: half the ranks silent; per tick half of the changed ranks come back, half go silent;
* ``crash``: one rank raised, half its peers failed in the all-reduce; per tick more peers fail;
* ``hang``: every rank stalled with a stack sample (the culprit in user code), half the peers'
  collective timeouts; per tick more timeouts;
* ``nan``: the culprit's loss non-finite at step 20, half the peers' at 21; per tick more peers;
* ``stall``: half the ranks stalled, no stack samples (the culprits by least progress); per tick
  more stall;
* ``silent``: the culprit stalled (no stack samples), half its peers silent since; per tick more
  go silent.
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents.stacks import Frame, StackSample
from revision import git

RUN = "big"
CHANGED = 100  # ranks changing state per tick
TICK_S = 0.2
SCENARIOS = ("lost", "crash", "hang", "nan", "stall", "silent")
PEER = "crashed: builtins.RuntimeError: Launch kernel failed, name:Default/AllReduce-op2 (rank {r})"
IN_COLLECTIVE = (Frame("mindspore/common/api.py", 1891, "_exec_pip"),
                 Frame("job/train.py", 136, "main"))  # fmt: skip
IN_USER = (Frame("job/train.py", 98, "on_train_step_begin"), Frame("job/train.py", 136, "main"))
PACKAGE = "rankwatch.aggregator.incidents"

Burst = tuple[float, dict[str, list[Any]]]


def _health(
    n: int, r: int, state: RankState, t: float, msg: str = "", step: int = 10
) -> RankHealth:
    return RankHealth(RUN, r, state, f"node{r // 8}", 100_000 + r, n, step, t, 0.0, msg, 0, 5.0,
                      t, None, t)  # fmt: skip


def _nan(r: int, step: int) -> Divergence:
    x = float("nan")
    return Divergence(RUN, "loss", r, "nonfinite", "high", step, step, x, 2.3, x, x, "", 0)


def scenario(name: str, n: int, ticks: int) -> tuple[list[Burst], list[Burst]]:
    """(setup bursts, timed bursts), each (now, ``observe`` arguments)."""
    setup: list[Burst] = [
        (0.0, {"health": [_health(n, r, RankState.ALIVE, 0.0) for r in range(n)]})
    ]
    culprit = n // 3
    peers = [r for r in range(n) if r != culprit]
    half = len(peers) // 2
    more = [peers[half + k * CHANGED : half + (k + 1) * CHANGED] for k in range(ticks)]
    timed: list[Burst] = []
    if name == "lost":
        gone = "no record for 12 s"
        setup.append((1.0, {"health": [_health(n, r, RankState.LOST, 1.0, gone)
                                       for r in range(n // 2)]}))  # fmt: skip
        mid, step = n // 2, CHANGED // 2
        for k in range(1, ticks + 1):
            t = 1.0 + TICK_S * k
            back = [
                _health(n, r, RankState.ALIVE, t)
                for r in range(mid - step * k, mid - step * (k - 1))
            ]
            lost = [
                _health(n, r, RankState.LOST, t, gone)
                for r in range(mid + step * (k - 1), mid + step * k)
            ]
            timed.append((t, {"health": back + lost}))
    elif name == "crash":
        own = _health(n, culprit, RankState.CRASHED, 1.0, "crashed: builtins.ValueError: injected")
        setup.append((1.0, {"health": [own]}))
        setup.append((2.0, {"health": [_health(n, r, RankState.CRASHED, 2.0, PEER.format(r=r))
                                       for r in peers[:half]]}))  # fmt: skip
        for k, part in enumerate(more):
            t = 2.0 + TICK_S * (k + 1)
            timed.append((t, {"health": [_health(n, r, RankState.CRASHED, t, PEER.format(r=r))
                                         for r in part]}))  # fmt: skip
    elif name == "hang":
        stalled = [_health(n, r, RankState.STALLED, 45.0, "no step for 30 s", 19) for r in range(n)]
        stacks = [StackSample(RUN, r, 44.0, 19, "user" if r == culprit else "framework",
                              "u" if r == culprit else "f",
                              IN_USER if r == culprit else IN_COLLECTIVE)
                  for r in range(n)]  # fmt: skip
        setup.append((45.0, {"health": stalled, "stacks": stacks}))
        setup.append((60.0, {"health": [_health(n, r, RankState.CRASHED, 60.0, PEER.format(r=r), 19)
                                        for r in peers[:half]]}))  # fmt: skip
        for k, part in enumerate(more):
            t = 60.0 + TICK_S * (k + 1)
            timed.append((t, {"health": [_health(n, r, RankState.CRASHED, t, PEER.format(r=r), 19)
                                         for r in part]}))  # fmt: skip
    elif name == "nan":
        setup.append(
            (1.0, {"divergences": [_nan(culprit, 20)] + [_nan(r, 21) for r in peers[:half]]})
        )
        for k, part in enumerate(more):
            timed.append((1.0 + TICK_S * (k + 1), {"divergences": [_nan(r, 21) for r in part]}))
    elif name == "stall":
        quiet = "no step for 30 s"
        setup.append((45.0, {"health": [_health(n, r, RankState.STALLED, 45.0, quiet, 19)
                                        for r in range(n // 2)]}))  # fmt: skip
        for k in range(ticks):
            t = 45.0 + TICK_S * (k + 1)
            part = range(n // 2 + k * CHANGED, n // 2 + (k + 1) * CHANGED)
            timed.append((t, {"health": [_health(n, r, RankState.STALLED, t, quiet, 19)
                                         for r in part]}))  # fmt: skip
    elif name == "silent":
        own = _health(n, culprit, RankState.STALLED, 45.0, "no step for 30 s", 19)
        gone = "no record for 12 s"
        setup.append((45.0, {"health": [own]}))
        setup.append((46.0, {"health": [_health(n, r, RankState.LOST, 46.0, gone, 19)
                                        for r in peers[:half]]}))  # fmt: skip
        for k, part in enumerate(more):
            t = 46.0 + TICK_S * (k + 1)
            timed.append((t, {"health": [_health(n, r, RankState.LOST, t, gone, 19)
                                         for r in part]}))  # fmt: skip
    else:
        raise ValueError(f"unknown scenario {name!r}")
    return setup, timed


def per_tick(tracker_class: type, name: str, n: int, ticks: int) -> tuple[float, list[dict]]:
    """Median CPU ms of one tick's ``observe``, and the incidents after the last (as dicts)."""
    setup, timed = scenario(name, n, ticks)
    tracker = tracker_class()
    for now, given in setup:
        tracker.observe(now, **given)
    spent = []
    for now, given in timed:
        t0 = time.process_time()
        tracker.observe(now, **given)
        spent.append((time.process_time() - t0) * 1e3)
    return statistics.median(spent), [i.as_dict() for i in tracker.incidents(RUN)]


def tracker_of(rev: str) -> type:
    """``IncidentTracker`` as revision ``rev`` of this repository has it: its incident modules
    copied into a package of their own (the rest of the aggregator is this tree's)."""
    names = git("ls-tree", "--name-only", rev, "aggregator/incidents/").split()
    alias = "rankwatch_incidents_" + "".join(c if c.isalnum() else "_" for c in rev)
    folder = Path(tempfile.mkdtemp(prefix="incidents-")) / alias
    atexit.register(shutil.rmtree, folder.parent, True)  # imported by then: not needed after
    folder.mkdir()
    for path in names:
        if path.endswith(".py"):
            text = git("show", f"{rev}:{path}").replace(PACKAGE, alias)
            (folder / Path(path).name).write_text(text)
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module(f"{alias}.tracker").IncidentTracker
