"""Load generator: N simulated ranks sending real agent wire records to an aggregator or relays.

    python bench/loadgen.py --ranks 1024 --rate 5 --duration 60 --addr tcp://127.0.0.1:8671 \\
        --faults drift:17:3,nan:5,spike:9,slow:40:2,hang:77,lost:100@30

A few worker processes (``bench/loadgen_worker.py``) each host a block of ranks. Every rank sends
what an agent sends: a ``start`` event, one ``step`` record per step with ``loss``, ``lr``,
``throughput``, ``step_time`` and ``grad_norm``, a heartbeat every ``--heartbeat-s`` (staggered
across ranks) and an ``end`` event, all as ``records.encode_frame`` frames with per-rank ``seq``.

``--sockets rank`` (default) gives every rank its own DEALER and one frame per rank per step, as
real agents do (one record per frame at a few steps/s). ``--sockets process`` shares one DEALER
per worker and batches a step's records into frames under ``MAX_FRAME_BYTES``; with
``--node-frames`` each frame holds one node's records of a step (``--ranks-per-node``), the
frame a node's relay forwards when its ranks step together, so one socket stands in for many
relays. ``--sockets node`` gives every node (``--ranks-per-node`` consecutive ranks) its own
DEALER, one frame per node per step: the connections a head node behind per-node relays
really holds (12,500 at 100,000 ranks). ``--metrics 8`` adds ``grad_norm_local``,
``data_time`` and ``loss_scale`` to every step record. ``--addr`` may list several endpoints
(relays): ranks are split into that many contiguous blocks, one per endpoint.

Values are seeded and independent of how ranks are split across workers: step ``s`` draws the
noise of every rank from ``default_rng([seed, s])``. The loss decays with 5 % relative per-rank
noise (``LOSS_SIGMA``); a drift of ``k`` sigma adds ``k * LOSS_SIGMA * loss`` to one rank.

Faults (``kind:rank[:magnitude][@step]``, onset default ``--fault-step``):

=========  ==========================================================  ===============
kind       effect from the onset step on                               magnitude
=========  ==========================================================  ===============
drift      loss += magnitude sigma                                     sigma (3)
nan        loss is NaN                                                 -
spike      loss += magnitude sigma, at the onset step only             sigma (20)
slow       step_time x magnitude, throughput / magnitude               factor (2)
hang       no more step records; heartbeats go on (last_step stuck)    -
lost       silence: no steps, heartbeats or end event                  -
hot        card temperature += magnitude °C (telemetry)                °C (25)
throttle   SM clock x magnitude, thermal slowdown reasons set,         clock factor
           step_time / magnitude                                       (0.7)
ecc        an ECC burst: corrected += 100 x magnitude per sample,      errors (4)
           uncorrected += magnitude once
nodeslow   every rank of that rank's node: step_time x magnitude,      factor (1.5)
           host CPU at 100 %, load x 3
nanspread  loss is NaN, every rank's from the next step on             -
hangwait   hangs; every rank waits, the peers fail after a while       seconds (4)
crashwait  raises; every rank waits, the peers fail after a while      seconds (4)
=========  ==========================================================  ===============

The last three spread to every rank (``bench/loadgen_cascade.py``), with seeded noise
(``--jitter-s``, ``--lag-ticks``, ``--spread-s``, ``--shuffle``) and crash texts read from files
(``--peer-text``, ``--culprit-text``).

With ``--telemetry-s`` (0: off) each rank also sends telemetry records (schema version 2, in
frames of their own) every that many seconds, staggered: a ``gpu`` record for its card
(``gpu:<rank % ranks_per_node>``: ``util_pct``, ``mem_used_bytes``, ``mem_total_bytes``,
``temp_c``, ``power_w``, ``power_limit_w``, ``sm_clock_mhz``, ``throttle_mask``,
``ecc_corrected_total``, ``ecc_uncorrected_total``, label ``throttle``) and a ``host`` record
(``cpu_pct``, ``load1``, ``mem_available_bytes``), with seeded per-card noise; the hardware
faults above show there from their onset step.

Prints progress every 5 s and a JSON summary (records and frames sent, schedule lag) at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from loadgen_cascade import CASCADE_KINDS, DEFAULT_WAIT_S, WHERES, Noise

METRICS = ("loss", "lr", "throughput", "step_time", "grad_norm")
# With --metrics 6..8: what a large LLM job also logs (the pre-all-reduce norm, the loader's
# time, the loss scale), so a head node's per-record cost is measured at a realistic width.
EXTRA_METRICS = ("grad_norm_local", "data_time", "loss_scale")
DATA_TIME_S = 0.05  # the loader's host time per step, 10 % relative noise
LOSS_SIGMA = 0.05  # relative per-rank noise of the loss (the sigma of drift faults)
GRAD_SIGMA = 0.10  # relative per-rank noise of grad_norm
STEP_TIME_SIGMA = 0.02  # relative per-rank noise of step_time
BATCH_SIZE = 32  # samples per step per rank (throughput = BATCH_SIZE / step_time)
BASE_LR = 1e-3
WARMUP_STEPS = 100  # lr warm-up
FAULT_KINDS = (
    "drift",
    "nan",
    "spike",
    "slow",
    "hang",
    "lost",
    "hot",
    "throttle",
    "ecc",
    "nodeslow",
    *CASCADE_KINDS,
)
DEFAULT_MAGNITUDE = {
    "drift": 3.0, "spike": 20.0, "slow": 2.0, "hot": 25.0, "throttle": 0.7, "ecc": 4.0,
    "nodeslow": 1.5, "hangwait": DEFAULT_WAIT_S, "crashwait": DEFAULT_WAIT_S,
}  # fmt: skip
# Telemetry of a healthy card and host: (mean, relative sigma) of each value.
CARD = {
    "util_pct": (97.0, 0.01), "temp_c": (60.0, 0.03), "power_w": (600.0, 0.02),
    "sm_clock_mhz": (1980.0, 0.005), "mem_used_bytes": (70e9, 0.01),
}  # fmt: skip
CARD_TOTAL_BYTES = 85899345920.0
POWER_LIMIT_W = 700.0
HOST = {"cpu_pct": (30.0, 0.1), "load1": (8.0, 0.1), "mem_available_bytes": (5e11, 0.02)}
THERMAL_SLOWDOWN = 0x20 | 0x40  # NVML's sw_thermal and hw_thermal clock event reasons
PROGRESS_S = 5.0  # progress line period of the CLI
SOCKETS = ("rank", "node", "process")  # one DEALER per rank, per node, per worker and address
READY_TIMEOUT_S = 120.0  # workers must have their sockets within this
START_DELAY_S = 0.5  # between "all workers ready" and step 1
WORKER = Path(__file__).with_name("loadgen_worker.py")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    magnitude: float | None
    step: int  # onset


def parse_faults(text: str, world: int, default_step: int) -> list[Fault]:
    """``drift:17:3,nan:5@40,...``; ``ValueError`` names the bad item."""
    out: list[Fault] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        spec, _, at = item.partition("@")
        parts = spec.split(":")
        kind = parts[0]
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault {item!r}: kind must be one of {', '.join(FAULT_KINDS)}")
        if len(parts) < 2 or len(parts) > 3:
            raise ValueError(f"fault {item!r}: expected kind:rank[:magnitude][@step]")
        try:
            rank = int(parts[1])
            magnitude = float(parts[2]) if len(parts) == 3 else DEFAULT_MAGNITUDE.get(kind)
            step = int(at) if at else default_step
        except ValueError:
            raise ValueError(
                f"fault {item!r}: rank and step must be integers, magnitude a number"
            ) from None
        if not 0 <= rank < world:
            raise ValueError(f"fault {item!r}: rank {rank} is not in 0..{world - 1}")
        if step < 1:
            raise ValueError(f"fault {item!r}: onset step must be >= 1")
        if magnitude is not None and not math.isfinite(magnitude):
            raise ValueError(f"fault {item!r}: magnitude must be finite")
        if kind in ("slow", "throttle", "nodeslow") and magnitude is not None and magnitude <= 0:
            raise ValueError(f"fault {item!r}: {kind} factor must be > 0")
        if kind in ("hangwait", "crashwait") and magnitude is not None and magnitude <= 0:
            raise ValueError(f"fault {item!r}: the peers' wait must be > 0 seconds")
        out.append(Fault(kind, rank, magnitude, step))
    return out


class Model:
    """Seeded metric values of every rank at a step (pure: no clock, no sockets)."""

    def __init__(
        self, world: int, rate: float, seed: int, faults: Sequence[Fault], ranks_per_node: int = 8
    ) -> None:
        self.world, self.rate, self.seed = world, rate, seed
        self.faults = list(faults)
        self.node = ranks_per_node

    def node_ranks(self, rank: int) -> slice:
        """The ranks on ``rank``'s node (``node<rank // ranks_per_node>``)."""
        first = rank // self.node * self.node
        return slice(first, min(first + self.node, self.world))

    def lr(self, step: int) -> float:
        warm = min(1.0, step / WARMUP_STEPS)
        return BASE_LR * warm * (0.5 + 0.5 * math.cos(min(step, 100_000) / 100_000 * math.pi))

    def values(self, step: int, metrics: int = len(METRICS)) -> dict[str, np.ndarray]:
        """metric -> float64 array over all ranks (slice it for a block of ranks); the first
        ``metrics`` of METRICS + EXTRA_METRICS."""
        rng = np.random.default_rng([self.seed, step])
        noise = rng.standard_normal((3, self.world))
        extra = rng.standard_normal((2, self.world)) if metrics > len(METRICS) else None
        loss_level = 0.5 + 2.0 * math.exp(-step / 500)
        loss = loss_level * (1 + LOSS_SIGMA * noise[0])
        grad = (1.0 + 2.0 * math.exp(-step / 300)) * (1 + GRAD_SIGMA * noise[1])
        step_time = (1.0 / self.rate) * (1 + STEP_TIME_SIGMA * noise[2])
        for f in self.faults:
            if step < f.step:
                continue
            mag = f.magnitude or 0.0
            if f.kind == "drift":
                loss[f.rank] += mag * LOSS_SIGMA * loss_level
            elif f.kind == "nan":
                loss[f.rank] = math.nan
            elif f.kind == "nanspread":
                loss[f.rank if step == f.step else slice(None)] = math.nan
            elif f.kind == "spike" and step == f.step:
                loss[f.rank] += mag * LOSS_SIGMA * loss_level
            elif f.kind == "slow":
                step_time[f.rank] *= mag
            elif f.kind == "throttle":
                step_time[f.rank] /= mag
            elif f.kind == "nodeslow":
                step_time[self.node_ranks(f.rank)] *= mag
        out = {
            "loss": loss,
            "lr": np.full(self.world, self.lr(step)),  # a shared schedule: bit-identical
            "throughput": BATCH_SIZE / step_time,
            "step_time": step_time,
            "grad_norm": grad,
        }
        if extra is not None:  # drawn after the others: their seeded values do not change
            out["grad_norm_local"] = grad * (1 + GRAD_SIGMA * extra[0])
            out["data_time"] = DATA_TIME_S * (1 + 0.1 * extra[1])
            out["loss_scale"] = np.full(self.world, 65536.0)
        return {m: out[m] for m in (*METRICS, *EXTRA_METRICS)[:metrics]}

    def telemetry(self, step: int) -> dict[str, np.ndarray]:
        """``gpu/<key>`` and ``host/<key>`` -> float64 array over all ranks, for samples
        taken at ``step`` (seeded by step as ``values`` is; faults from their onset)."""
        rng = np.random.default_rng([self.seed, step, 1])
        out: dict[str, np.ndarray] = {}
        for key, (mean, sigma) in {**CARD, **HOST}.items():
            prefix = "gpu" if key in CARD else "host"
            out[f"{prefix}/{key}"] = mean * (1 + sigma * rng.standard_normal(self.world))
        out["gpu/mem_total_bytes"] = np.full(self.world, CARD_TOTAL_BYTES)
        out["gpu/power_limit_w"] = np.full(self.world, POWER_LIMIT_W)
        out["gpu/throttle_mask"] = np.zeros(self.world)
        out["gpu/ecc_corrected_total"] = np.zeros(self.world)
        out["gpu/ecc_uncorrected_total"] = np.zeros(self.world)
        for f in self.faults:
            if step < f.step:
                continue
            mag = f.magnitude or 0.0
            if f.kind == "hot":
                out["gpu/temp_c"][f.rank] += mag
            elif f.kind == "throttle":
                out["gpu/sm_clock_mhz"][f.rank] *= mag
                out["gpu/temp_c"][f.rank] += 30.0
                out["gpu/throttle_mask"][f.rank] = THERMAL_SLOWDOWN
            elif f.kind == "ecc":
                samples = step - f.step + 1
                out["gpu/ecc_corrected_total"][f.rank] += 100 * mag * samples
                out["gpu/ecc_uncorrected_total"][f.rank] += mag
            elif f.kind == "nodeslow":
                node = self.node_ranks(f.rank)
                out["host/cpu_pct"][node] = 100.0
                out["host/load1"][node] *= 3
                out["gpu/util_pct"][node] /= f.magnitude or 1.0
        return out


@dataclass
class LoadConfig:
    ranks: int = 1024
    rate: float = 5.0  # steps per second
    duration: float = 60.0  # seconds
    addrs: list[str] = field(default_factory=lambda: ["tcp://127.0.0.1:8671"])
    faults: list[Fault] = field(default_factory=list)
    procs: int = 2
    sockets: str = "rank"  # "rank": one DEALER per rank; "node": per node; "process": per worker
    seed: int = 0
    run: str = "loadgen"
    heartbeat_s: float = 5.0
    ranks_per_node: int = 8  # simulated host names: node<rank // ranks_per_node>
    telemetry_s: float = 0.0  # seconds between a rank's telemetry samples (0: none)
    noise: Noise = field(default_factory=Noise)  # of the cascade faults
    metrics: int = len(METRICS)  # per step record: the first of METRICS + EXTRA_METRICS
    node_frames: bool = False  # --sockets process: one frame per node per step (relay-shaped)

    @property
    def steps(self) -> int:
        return max(1, round(self.duration * self.rate))

    def check(self) -> None:
        if self.ranks < 1 or self.procs < 1 or self.ranks_per_node < 1:
            raise ValueError("ranks, procs and ranks_per_node must be >= 1")
        if not (self.rate > 0 and self.duration > 0 and self.heartbeat_s > 0):
            raise ValueError("rate, duration and heartbeat_s must be > 0")
        if not 0 <= self.telemetry_s < math.inf:
            raise ValueError("telemetry_s must be >= 0 (0: no telemetry)")
        if not len(METRICS) <= self.metrics <= len(METRICS) + len(EXTRA_METRICS):
            raise ValueError(f"metrics must be {len(METRICS)}..{len(METRICS + EXTRA_METRICS)}")
        if self.sockets not in SOCKETS:
            raise ValueError(f"sockets must be one of {', '.join(SOCKETS)}, got {self.sockets!r}")
        if not self.addrs or len(self.addrs) > self.ranks:
            raise ValueError("need between 1 and --ranks addresses")
        self.noise.check()

    def segments(self) -> list[list[tuple[int, int, str]]]:
        """Per worker: its (rank_lo, rank_hi, addr) blocks (address blocks split by worker)."""
        n, k = self.ranks, len(self.addrs)
        edges = [round(i * n / k) for i in range(k + 1)]
        workers = [round(i * n / self.procs) for i in range(self.procs + 1)]
        out: list[list[tuple[int, int, str]]] = []
        for w in range(self.procs):
            lo, hi = workers[w], workers[w + 1]
            segs = []
            for a in range(k):
                s_lo, s_hi = max(lo, edges[a]), min(hi, edges[a + 1])
                if s_lo < s_hi:
                    segs.append((s_lo, s_hi, self.addrs[a]))
            out.append(segs)
        return out


@dataclass
class WorkerState:
    proc: subprocess.Popen[str]
    ranks: tuple[int, int]
    step_time: dict[int, float] = field(default_factory=dict)  # step -> wall time created
    sent: int = 0  # records handed to ZeroMQ so far
    done: dict[str, Any] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: str = ""


class LoadGen:
    """Runs the workers; ``sent()`` and ``created(rank, step)`` are live while it runs."""

    def __init__(
        self, config: LoadConfig, on_step: Callable[[int, int, float], None] | None = None
    ) -> None:
        config.check()
        self.config = config
        self.workers: list[WorkerState] = []
        self._on_step = on_step  # (worker index, step, created) from the reader threads
        self._threads: list[threading.Thread] = []
        self.start_at = 0.0

    def start(self) -> None:
        cfg = self.config
        base = {k: v for k, v in asdict(cfg).items() if k not in ("addrs", "procs")}
        for index, segs in enumerate(cfg.segments()):
            spec = {**base, "segments": segs, "index": index}
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            state = WorkerState(proc, (segs[0][0], segs[-1][1]) if segs else (0, 0))
            self.workers.append(state)
            thread = threading.Thread(target=self._read, args=(index, state), daemon=True)
            thread.start()
            self._threads.append(thread)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for state in self.workers:
            if not state.ready.wait(max(0.0, deadline - time.monotonic())) or state.error:
                self.kill()
                raise RuntimeError(f"a load worker did not start: {state.error or 'timeout'}")
        self.start_at = time.time() + START_DELAY_S
        for state in self.workers:
            assert state.proc.stdin is not None
            state.proc.stdin.write(f"{self.start_at!r}\n")
            state.proc.stdin.flush()

    def _read(self, index: int, state: WorkerState) -> None:
        assert state.proc.stdout is not None
        for line in state.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            kind = msg.get("t")
            if kind == "step":
                state.step_time[msg["step"]] = msg["time"]
                state.sent = msg["sent"]
                if self._on_step is not None:
                    self._on_step(index, msg["step"], msg["time"])
            elif kind == "ready":
                state.ready.set()
            elif kind == "done":
                state.sent = msg["records"]
                state.done = msg
        if state.done is None:
            state.error = f"worker {index} exited with code {state.proc.wait()}"
        state.ready.set()

    def sent(self) -> int:
        return sum(w.sent for w in self.workers)

    def worker_of(self, rank: int) -> WorkerState:
        for state in self.workers:
            if state.ranks[0] <= rank < state.ranks[1]:
                return state
        raise KeyError(rank)

    def created(self, rank: int, step: int) -> float | None:
        """Wall time at which ``rank``'s record of ``step`` was made, once known."""
        return self.worker_of(rank).step_time.get(step)

    def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for every worker; returns the summed summary. Raises if a worker failed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for state, thread in zip(self.workers, self._threads, strict=True):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            state.proc.wait(left)
            thread.join(5.0)
        errors = [w.error for w in self.workers if w.error or w.done is None]
        if errors:
            raise RuntimeError("; ".join(e or "a worker gave no summary" for e in errors))
        return summarize([w.done for w in self.workers if w.done is not None])

    def kill(self) -> None:
        for state in self.workers:
            if state.proc.poll() is None:
                state.proc.kill()
                state.proc.wait()


def summarize(dones: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"records": 0, "frames": 0, "by_kind": {}, "again": 0}
    for d in dones:
        total["records"] += d["records"]
        total["frames"] += d["frames"]
        total["again"] += d["again"]
        for kind, count in d["by_kind"].items():
            total["by_kind"][kind] = total["by_kind"].get(kind, 0) + count
    lags = [d["lag_p95_ms"] for d in dones]
    total["lag_p95_ms"] = max(lags, default=0.0)
    total["lag_max_ms"] = max((d["lag_max_ms"] for d in dones), default=0.0)
    total["elapsed_s"] = max((d["elapsed_s"] for d in dones), default=0.0)
    return total


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    steps = max(1, round(args.duration * args.rate))
    fault_step = args.fault_step if args.fault_step is not None else max(5, steps // 5)
    return LoadConfig(
        ranks=args.ranks,
        rate=args.rate,
        duration=args.duration,
        addrs=[a.strip() for a in args.addr.split(",") if a.strip()],
        faults=parse_faults(args.faults, args.ranks, fault_step),
        procs=args.procs,
        sockets=args.sockets,
        seed=args.seed,
        run=args.run,
        heartbeat_s=args.heartbeat_s,
        ranks_per_node=args.ranks_per_node,
        telemetry_s=args.telemetry_s,
        metrics=args.metrics,
        node_frames=args.node_frames,
        noise=Noise(
            args.jitter_s, args.lag_ticks, args.spread_s, args.shuffle,
            *(_text(path, default) for path, default in (
                (args.peer_text, Noise.peer_text), (args.culprit_text, Noise.culprit_text))),
            args.where,
        ),
    )  # fmt: skip


def _text(path: str | None, default: str) -> str:
    if path is None:
        return default
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--rate", type=float, default=5.0, help="steps per second per rank")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--addr", default="tcp://127.0.0.1:8671", help="endpoint(s), comma-separated")
    ap.add_argument("--faults", default="", help="kind:rank[:magnitude][@step],...")
    ap.add_argument("--fault-step", type=int, default=None, help="default onset (steps/5)")
    ap.add_argument("--procs", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--sockets", choices=SOCKETS, default="rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run", default=f"loadgen-{int(time.time())}")
    ap.add_argument("--heartbeat-s", type=float, default=5.0)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--metrics", type=int, default=len(METRICS), help="per step record (5..8)")
    ap.add_argument(
        "--node-frames",
        action="store_true",
        help="with --sockets process: one frame per node per step, as a node's relay sends",
    )
    ap.add_argument("--telemetry-s", type=float, default=0.0, help="telemetry every (0: none)")
    ap.add_argument("--jitter-s", type=float, default=0.0, help="ranks' clock offsets, up to")
    ap.add_argument("--lag-ticks", type=int, default=0, help="culprit's records sent late")
    ap.add_argument("--spread-s", type=float, default=0.0, help="peers' failures spread over")
    ap.add_argument("--shuffle", action="store_true", help="send each tick's records shuffled")
    ap.add_argument("--peer-text", metavar="FILE", help="the peers' crash text (a file)")
    ap.add_argument("--culprit-text", metavar="FILE", help="the crashing rank's text (a file)")
    ap.add_argument("--where", choices=WHERES, default="dataloader", help="the hung rank's place")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        config = config_from_args(args)
        config.check()
    except ValueError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    gen = LoadGen(config)
    try:
        gen.start()
        print(
            f"loadgen: {config.ranks} ranks x {config.rate:g} steps/s x {config.steps} steps, "
            f"{config.procs} workers, sockets per {config.sockets}, run {config.run!r}",
            flush=True,
        )
        t0 = time.monotonic()
        while any(w.proc.poll() is None for w in gen.workers):
            time.sleep(0.2)
            if time.monotonic() - t0 >= PROGRESS_S:
                t0 = time.monotonic()
                print(f"loadgen: {gen.sent():,} records sent", flush=True)
        summary = gen.wait()
    except (RuntimeError, KeyboardInterrupt) as exc:
        gen.kill()
        print(f"loadgen: {exc or 'interrupted'}", file=sys.stderr)
        return 1
    rate = summary["records"] / max(summary["elapsed_s"], 1e-9)
    print(
        f"loadgen: sent {summary['records']:,} records in {summary['frames']:,} frames "
        f"({rate:,.0f} records/s), schedule lag p95 {summary['lag_p95_ms']:.1f} ms, "
        f"max {summary['lag_max_ms']:.1f} ms"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
