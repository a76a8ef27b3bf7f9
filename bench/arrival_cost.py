"""What a head node pays for a new rank, and for the alert rules' pass over a run with many
lost ranks.

    python bench/arrival_cost.py [--ranks 4096,16384,100000] [--passes 5] [--skip-full]
    python bench/arrival_cost.py --refresh [--ranks 16384,100000] [--repeat 21]

* arrival: a real ``Aggregator`` (DuckDB store in a temporary folder, no sockets) takes in
  every rank's first records, a ``start`` event, a step of 8 metrics and a heartbeat, as two
  relays' ranks interleaved (ranks 0.. and N/2..), through ``add()`` in batches of
  ``BATCH_RECORDS``, with a tick every ``TICK_S`` of the simulated clock (records arriving at
  ``ARRIVAL_RATE`` per second): CPU µs per new rank, adds and ticks together.
* health rules: the alert engine (``AlertEngine.evaluate``) over a run whose first half is
  lost, each pass after ``FLIPS`` ranks changed state (half back, half lost) and ``STEPPED``
  others' steps moved: ms per pass given the ranks that changed and those evaluated again
  (what the service passes), per full pass (every rank looked at:
  ``--skip-full`` leaves it out), and per tick that brings no health (what every other tick
  pays for the conditions standing).
* ``--refresh`` (only this): the health view's refresh of a run after ``REFRESH_RANKS`` of its
  ranks' records, scattered (what the tick pays after records that may change a state), and
  for ``SHARE_RANKS`` ranks in rank order (a share of the rolling sweep), and the run's digest
  (what a big run's live counts cost), each as before (the run's table copied whole, a pass
  over every rank) and as now (``RankTable``: the blocks of those ranks copied, the counts kept
  up), timed alternately in the same run: median CPU µs and the ratio before / now;
  "evaluating" is what both refreshes spend evaluating those ranks, the rest is the table.

The first size is the baseline of the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rankwatch.agent.wire.records import EventRecord, Heartbeat, StepRecord
from rankwatch.aggregator.alerts.rules import AlertEngine
from rankwatch.aggregator.health import HealthTracker, RankHealth, RankState
from rankwatch.aggregator.ranksummary import digest
from rankwatch.aggregator.service import Aggregator, ServeConfig

METRICS = ("loss", "lr", "throughput", "step_time", "grad_norm", "grad_norm_local",
           "data_time", "loss_scale")  # fmt: skip
RANKS_PER_NODE = 8
BATCH_RECORDS = 2000  # what one receive hands the service, about
ARRIVAL_RATE = 40_000.0  # records/s: 100,000 ranks x 0.2 steps/s, steps and heartbeats
TICK_S = 0.2
STEADY_S = 3600.0
FLIPS = 100
STEPPED = 5000  # alive ranks evaluated again (their step moved) before each pass
REFRESH_RANKS = 100  # ranks evaluated again per refresh, scattered
SHARE_RANKS = 1000  # ranks in rank order per refresh: a share of the rolling sweep, about


def first_records(lo: int, hi: int, world: int, t: float) -> tuple[list[Any], list[Any]]:
    """Ranks lo..hi-1's start events, then their first step and heartbeat."""
    starts: list[Any] = []
    steps: list[Any] = []
    for r in range(lo, hi):
        host, pid = f"node{r // RANKS_PER_NODE}", 100_000 + r
        starts.append(EventRecord("big", r, 1, t, world, host, pid, "start", None, {}))
        steps.append(
            StepRecord("big", r, 2, t, world, host, pid, 1, 0, dict.fromkeys(METRICS, 1.0))
        )
        steps.append(Heartbeat("big", r, 3, t, 1, 5.0, 0))
    return starts, steps


def arrival(ranks: int) -> float:
    """CPU µs per new rank."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServeConfig(data_dir=Path(tmp), console_alerts=False, resend_gaps=False,
                          lost_after_s=STEADY_S, min_stall_s=STEADY_S)  # fmt: skip
        agg = Aggregator(cfg)
        t = time.time()
        half = ranks // 2
        a_starts, a_steps = first_records(0, half, ranks, t)
        b_starts, b_steps = first_records(half, ranks, ranks, t)
        batches: list[list[Any]] = []
        for a, b in ((a_starts, b_starts), (a_steps, b_steps)):  # the two relays in turn
            for i in range(0, max(len(a), len(b)), BATCH_RECORDS // 2):
                batches.append(a[i : i + BATCH_RECORDS // 2] + b[i : i + BATCH_RECORDS // 2])
        now, next_tick = t, t + TICK_S
        cpu = time.process_time()
        for batch in batches:
            agg.add(batch, imported=False, now=now)
            now += len(batch) / ARRIVAL_RATE
            if now >= next_tick:
                agg.tick(now)
                next_tick += TICK_S
        agg.tick(now)
        cpu = time.process_time() - cpu
        agg.store.close()
    return cpu / ranks * 1e6


def rank(r: int, state: RankState, t: float) -> RankHealth:
    message = "no record for 12 s" if state is RankState.LOST else ""
    return RankHealth("big", r, state, f"node{r // RANKS_PER_NODE}", 100_000 + r, 0, 10, t, 0.0,
                      message, 0, 5.0, t)  # fmt: skip


def health_rules(ranks: int, passes: int, full: bool) -> dict[str, float]:
    """Median ms of the alert engine's passes (see the module docstring)."""
    lost = RankState.LOST
    states = {r: lost if r < ranks // 2 else RankState.ALIVE for r in range(ranks)}
    table = {r: rank(r, s, 0.0) for r, s in states.items()}
    out: dict[str, float] = {}
    for mode in ("given", "full") if full else ("given",):
        engine = AlertEngine()
        engine.evaluate(0.0, health={"big": table}, health_changed=None, hardware=[])
        snap, walls, idle = table, [], []
        for k in range(1, passes + 1):
            snap = dict(snap)
            mid, step = ranks // 2, FLIPS // 2  # lost ranks back, alive ones lost
            flip = [*range(mid - step * k, mid - step * (k - 1)),
                    *range(mid + step * (k - 1), mid + step * k)]  # fmt: skip
            for r in flip:
                s = RankState.ALIVE if snap[r].state is lost else lost
                snap[r] = dataclasses.replace(snap[r], state=s, since=float(k))
            stepped = [mid + (k * STEPPED + i) % (ranks - mid) for i in range(STEPPED)]
            for r in stepped:
                if snap[r].state is not lost:
                    snap[r] = dataclasses.replace(snap[r], last_step=10 + k)
            changed = evaluated = None
            if mode != "full":
                changed = {("big", r) for r in flip}
                evaluated = changed | {("big", r) for r in stepped}
            t = time.perf_counter()
            engine.evaluate(float(k), health={"big": snap}, health_changed=changed,
                            health_evaluated=evaluated, hardware=[])  # fmt: skip
            walls.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            engine.evaluate(k + 0.2, hardware=[])
            idle.append((time.perf_counter() - t) * 1e3)
        (alert,) = [a for a in engine.firing() if a.rule == "lost"]
        assert len(alert.ranks) == ranks // 2, (len(alert.ranks), ranks)
        out[f"pass_{mode}_ms"] = statistics.median(walls)
        out["idle_tick_ms"] = statistics.median(idle)
    return out


def _as_before(
    table: dict[int, RankHealth], tracker: HealthTracker, ranks: list[int], now: float
) -> dict[int, RankHealth]:
    """A refresh as it was: the run's table copied, the ranks evaluated again put in."""
    table = dict(table)
    table.update(tracker.health_of("big", ranks, now))
    return table


def refresh_cost(ranks: int, repeat: int) -> dict[str, float]:
    """Median µs of a refresh and of a digest, before and now (see the module docstring)."""
    tracker = HealthTracker(lost_after_s=STEADY_S, min_stall_s=STEADY_S)
    t = 1000.0
    for r in range(ranks):
        host, pid = f"node{r // RANKS_PER_NODE}", 100_000 + r
        tracker.observe(StepRecord("big", r, 1, t, ranks, host, pid, 1, 0, {"loss": 1.0}), t)
    snap = tracker.snapshot(t)
    before = dict(snap["big"].items())  # a run's table as it was: one dict
    snap["big"].tally()  # the service asks for a big run's digest every second: kept from then
    rng = random.Random(ranks)
    gc.collect()  # the fill's garbage: not this part's
    times: dict[str, list[float]] = {}
    for k in range(repeat):
        now = t + 1 + k
        tracker.observe(StepRecord("big", 0, 2 + k, now, ranks, "node0", 100_000, 2 + k, 0, {}),
                        now)  # fmt: skip
        lo = k * SHARE_RANKS % (ranks - SHARE_RANKS)
        cases = (("scattered", rng.sample(range(ranks), REFRESH_RANKS)),
                 ("share", list(range(lo, lo + SHARE_RANKS))))  # fmt: skip
        for case, touched in cases:
            steps = {
                "before": functools.partial(_as_before, before, tracker, touched, now),
                "now": functools.partial(tracker.refresh, snap, now, [("big", r) for r in touched]),
                "evaluating": functools.partial(tracker.health_of, "big", touched, now),
            }
            names = list(steps)
            got = {}
            for name in names[k % 3 :] + names[: k % 3]:  # each first in turn: warm caches
                t0 = time.process_time()  # CPU time: the machine is shared
                got[name] = steps[name]()
                times.setdefault(f"{case}_{name}", []).append((time.process_time() - t0) * 1e6)
            before, snap = got["before"], got["now"][0]
        t0 = time.process_time()
        old = digest(before)  # a plain mapping: one pass over every rank, as before
        t1 = time.process_time()
        new = digest(snap["big"])
        t2 = time.process_time()
        assert new == old and list(snap["big"]) == list(before), (ranks, k)
        times.setdefault("digest_before", []).append((t1 - t0) * 1e6)
        times.setdefault("digest_now", []).append((t2 - t1) * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def refresh_main(sizes: list[int], repeat: int) -> None:
    rows = [(n, refresh_cost(n, repeat)) for n in sizes]
    print(f"arrival_cost --refresh: one run; a refresh of {REFRESH_RANKS} scattered ranks, of "
          f"{SHARE_RANKS:,} in rank order (a share of the rolling sweep), and the digest; "
          f"median of {repeat}, CPU µs, before / now in the same run; (evaluating): what both "
          f"spend evaluating the ranks")  # fmt: skip
    head = f"{'before':>9} {'now':>8} {'ratio':>6}"
    print(f"{'':>8} {'scattered':>38} {'in order':>38} {'digest':>24}")
    print(f"{'ranks':>8} {head} {'(evaluating)':>13} {head} {'(evaluating)':>13} {head}")
    for n, m in rows:
        cells = []
        for case in ("scattered", "share", "digest"):
            b, w = m[f"{case}_before"], m[f"{case}_now"]
            cells.append(f"{b:>9.1f} {w:>8.1f} {b / w:>5.1f}x")
            if case != "digest":
                cells.append(f"{m[f'{case}_evaluating']:>13.1f}")
        print(f"{n:>8,} " + " ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4096,16384,100000", help="comma-separated sizes")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--skip-full", action="store_true", help="no full passes (slow at 100,000)")
    ap.add_argument("--refresh", action="store_true", help="only the refresh and the digest")
    ap.add_argument("--repeat", type=int, default=21, help="refreshes timed (--refresh)")
    args = ap.parse_args()
    if args.refresh:
        refresh_main([int(x) for x in args.ranks.split(",")], args.repeat)
        return
    rows = []
    for n in (int(x) for x in args.ranks.split(",")):
        rows.append({"ranks": n, "new_rank_us": arrival(n),
                     **health_rules(n, args.passes, not args.skip_full)})  # fmt: skip
    base = rows[0]
    cols = [c for c in ("new_rank_us", "pass_given_ms", "pass_full_ms", "idle_tick_ms")
            if c in base]  # fmt: skip
    print(
        f"arrival_cost: new rank = start + step of {len(METRICS)} metrics + heartbeat, CPU; "
        f"health rules: half the ranks lost, {FLIPS} flip per pass, median of {args.passes}"
    )
    print(f"{'ranks':>8} " + " ".join(f"{c:>22}" for c in cols))
    for row in rows:
        cells = " ".join(f"{row[c]:>13.2f} ({row[c] / max(base[c], 1e-9):5.1f}x)" for c in cols)
        print(f"{int(row['ranks']):>8,} {cells}")


if __name__ == "__main__":
    main()
