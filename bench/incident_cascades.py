"""Does a real ``rankwatch serve`` name the card that started a fault that spread to every rank?

    python bench/incident_cascades.py [--ranks 1024] [--seeds 10] [--scenarios nan,hang,crash]
                                      [--pause-s 3.5]

The load generator (``bench/loadgen.py``) drives ``--ranks`` simulated ranks over ZeroMQ into one
``serve`` (stall threshold ``--min-stall-s``), one run per scenario and seed:

* ``nan``: one rank's loss NaN at step K, every rank's from K + 1;
* ``hang``: one rank hangs at the start of step K outside the framework, every peer waits in the
  all-reduce (stack samples say where each is); the peers fail with a collective timeout a few
  seconds later, then the launcher kills the rank;
* ``crash``: one rank raises at step K, every peer fails in the all-reduce a little later.

The seed draws the culprit rank, the onset step, how long the peers wait and how spread their
failures are, each rank's clock offset, whether the culprit's records are sent late (after its
peers' later ones), the order of each tick's records, where the hung rank is, and which
framework's wording the crashes carry (``tests/fixtures/crashes``). Healthy ranks' values carry
the model's seeded noise. A seed is right when the run has exactly one incident, of the
scenario's cause, whose culprits are the injected rank alone, every other rank affected.
Printed per scenario: seeds right, seeds whose first announcement was already right (one
``[INCIDENT]`` line, no ``[UPDATED]`` one), seeds void (the load generator fell behind its
schedule long enough to stall its ranks for real: on a loaded machine), wall time per seed.
``--pause-s`` stops ``serve`` (SIGSTOP) that long from half a second before each fault, so that
the aggregator surely falls behind while the ranks go on sending, as on an overloaded head node.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen import Fault, LoadConfig, LoadGen
from loadgen_cascade import KILL_AFTER_S, WHERES, Noise
from serve_proc import ServeProc

CRASHES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "crashes"
# Peers' failures, as MindSpore (HCCL, gloo), torch (gloo, NCCL) and the launchers word them.
PEER_TEXTS = (
    "mindspore_allreduce_kernel.txt", "mindspore_hccl_timeout.txt",
    "mindspore_gloo_peer_closed.txt", "msrun_demo_hang_peer_allreduce.txt",
    "torch_gloo_timeout.txt", "torch_nccl_watchdog.txt", "torch_nccl_system_error.txt",
    "torchrun_demo_crash_peer_gloo.txt",
)  # fmt: skip
CULPRIT_TEXTS = ("user_valueerror.txt", "torch_cuda_oom.txt")
SCENARIOS = {"nan": ("nanspread", "nonfinite"), "hang": ("hangwait", "hang"),
             "crash": ("crashwait", "crash")}  # fmt: skip
RATE = 5.0  # steps per second per rank
HEARTBEAT_S = 1.0  # stack samples ride on heartbeats
MIN_STALL_S = 3.0  # serve's stall threshold
# A load generator that falls this far behind its schedule stalls its ranks for real: such a
# seed proves nothing either way and is counted apart (a loaded machine).
VOID_LAG_S = 0.5 * MIN_STALL_S
SETTLE_S = 2.0  # after the last record is taken: a few ticks for the verdicts
DRAIN_TIMEOUT_S = 60.0
LOG_DIR = Path("cascade-logs")  # when this folder exists, a wrong seed's serve lines go there


@dataclass(frozen=True)
class Draw:
    culprit: int
    fault: Fault
    noise: Noise
    duration: float


def draw(scenario: str, seed: int, ranks: int) -> Draw:
    """The seeded fault and noise of one run (pure)."""
    rng = random.Random(f"{scenario}:{seed}")
    kind, _ = SCENARIOS[scenario]
    culprit = rng.randrange(ranks)
    onset = rng.randint(8, 12)
    spread = rng.uniform(0.2, 1.5)
    lag = rng.choice((0, 1, 2)) if scenario == "nan" else rng.choice((0, 0, 1, 3))
    noise = Noise(
        jitter_s=rng.uniform(0.0, 0.3),
        lag_ticks=lag,
        spread_s=spread,
        shuffle=True,
        peer_text=(CRASHES / rng.choice(PEER_TEXTS)).read_text(),
        culprit_text=(CRASHES / rng.choice(CULPRIT_TEXTS)).read_text(),
        where=rng.choice(WHERES),
    )
    if scenario == "nan":
        wait, tail = None, 8 / RATE
    elif scenario == "hang":  # the peers time out after the stall is seen and sampled
        wait = rng.uniform(MIN_STALL_S + 1.0, MIN_STALL_S + 2.5)
        tail = wait + spread + KILL_AFTER_S + 1.0
    else:
        wait = rng.uniform(0.5, MIN_STALL_S + 1.0)
        tail = wait + spread + 1.0
    return Draw(culprit, Fault(kind, culprit, wait, onset), noise, onset / RATE + tail)


def judge(incidents: list[dict[str, Any]], culprit: int, cause: str, ranks: int) -> str:
    """ "" when right (one incident, its cause, the culprit alone, every other rank affected),
    else what was wrong."""
    if len(incidents) != 1:
        summary = [
            (i["cause"], i["culprits"][:4], i["state"], i["basis"][:60],
             [(e["rank"], e["what"][:40]) for e in i["timeline"][:3]])
            for i in incidents
        ]  # fmt: skip
        return f"{len(incidents)} incidents: {summary}"
    (inc,) = incidents
    if inc["culprits"] != [culprit] or inc["cause"] != cause:
        return f"{inc['cause']} culprits {inc['culprits'][:8]}: {inc['summary'][:160]}"
    if len(inc["affected"]) != ranks - 1 or culprit in inc["affected"] + inc["terminated"]:
        return f"{len(inc['affected'])} affected, terminated {inc['terminated'][:8]}"
    return ""


def pause(pid: int, at_s: float, for_s: float) -> threading.Thread:
    """SIGSTOP ``pid`` ``at_s`` from now, SIGCONT it ``for_s`` later: the aggregator falls
    behind for sure (as it may on an overloaded machine), while the ranks go on sending."""

    def run() -> None:
        time.sleep(at_s)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(for_s)
        finally:
            os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_one(
    head: ServeProc,
    scenario: str,
    seed: int,
    ranks: int,
    procs: int,
    sockets: str,
    pause_s: float = 0.0,
) -> tuple[str, bool, float]:
    """(what was wrong, "" when right or "void: ..." when the load generator fell behind;
    whether the first announcement was right; seconds). ``pause_s``: stop the ``serve``
    process that long, from half a second before the fault step."""
    d = draw(scenario, seed, ranks)
    run = f"cascade-{scenario}-{seed}"
    config = LoadConfig(
        ranks=ranks, rate=RATE, duration=d.duration, addrs=[head.addr], faults=[d.fault],
        procs=procs, sockets=sockets, seed=seed, run=run, heartbeat_s=HEARTBEAT_S, noise=d.noise,
    )  # fmt: skip
    t0 = time.monotonic()
    before = head.counters().get("records_accepted", 0)
    gen = LoadGen(config)
    try:
        gen.start()
        if pause_s > 0:
            pause(head.pid, max(0.0, d.fault.step / RATE - 0.5), pause_s)
        summary = gen.wait(timeout_s=d.duration + DRAIN_TIMEOUT_S)
    finally:
        gen.kill()
    sent, lag_s = summary["records"], summary["lag_max_ms"] / 1e3
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while head.counters().get("records_accepted", 0) - before < sent:
        if time.monotonic() > deadline:
            return f"the aggregator took too long for {sent} records", False, 0.0
        time.sleep(0.25)
    time.sleep(SETTLE_S)
    incidents = head.get(f"/api/runs/{run}/incidents")["incidents"]
    wrong = judge(incidents, d.culprit, SCENARIOS[scenario][1], ranks)
    if lag_s >= VOID_LAG_S:
        return f"void: the load generator fell {lag_s:.1f} s behind ({wrong or 'right'})", False, 0
    lines = list(head.lines)
    if wrong and LOG_DIR.is_dir():  # what serve said of the run, to tell why
        (LOG_DIR / f"{run}.log").write_text("\n".join(ln for ln in lines if run in ln) + "\n")
    opened = sum(f"[INCIDENT] {run}:" in line for line in lines)
    updated = any(f"[UPDATED] {run}:" in line for line in lines)
    return wrong, not wrong and opened == 1 and not updated, time.monotonic() - t0


def wait_http(head: ServeProc, timeout_s: float = 60.0) -> None:
    """The banner comes before the dashboard listens: wait for its first answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            head.counters()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--seeds", type=int, default=10, help="seeds per scenario")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--scenarios", default="nan,hang,crash")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--sockets", choices=("rank", "process"), default="process")
    ap.add_argument(
        "--pause-s",
        type=float,
        default=0.0,
        help="SIGSTOP serve this long just before each fault (0: never)",
    )
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if args.ranks < 4 or args.seeds < 1 or any(n not in SCENARIOS for n in names):
        ap.error(f"--ranks >= 4, --seeds >= 1, --scenarios from {', '.join(SCENARIOS)}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"{args.ranks} ranks, seeds {seeds.start}..{seeds.stop - 1}, one real serve", flush=True)
    failed = 0
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServeProc(Path(tmp) / "data", ["--min-stall-s", str(MIN_STALL_S)]) as head,
    ):
        wait_http(head)
        for name in names:
            right = first = void = 0
            took: list[float] = []
            for seed in seeds:
                wrong, first_right, seconds = run_one(
                    head, name, seed, args.ranks, args.procs, args.sockets, args.pause_s
                )
                void += wrong.startswith("void")
                right += not wrong
                first += first_right
                if seconds:
                    took.append(seconds)
                if wrong:
                    print(f"  {name} seed {seed}: {wrong}", flush=True)
            counted = args.seeds - void
            failed += counted - right
            per = sum(took) / max(len(took), 1)
            print(
                f"{name:6} {right}/{counted} seeds right, first announcement right in "
                f"{first}/{counted}, {void} void, {per:.1f} s per seed",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
