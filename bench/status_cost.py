"""What one head node pays per rank for its reads: ``/api/status``, ``/metrics``,
``/api/runs/{run}/divergence``, the snapshot, the tick, and how long each holds the lock that
ingest needs.

    python bench/status_cost.py [--ranks 4096,16384,100000] [--steps 3] [--metrics 8] [--gapped]

A real ``Aggregator`` (real DuckDB store in a temporary folder, no sockets) is fed ``--steps``
steps of every rank through ``add()``, as the ingest thread would, then each read is timed
``--repeat`` times through the real dashboard app (``TestClient``: routing, JSON encoding). The
lock is wrapped in a timer, so "lock" is the longest single hold of the service lock during the
read (what a record arriving meanwhile waits); each read follows a tick, as in a server, and
"sweep" is one evaluation of every rank's health (which the tick does at most once a second).
RSS is this process's growth over the fill, per rank. The first size is the baseline of the ratios.
"divergence_every_rank" is the snapshot with every rank's entry that ``/divergence`` built
before it listed ranks as ``/api/status`` does (without the JSON), and "status_every_divergence"
``/api/status`` listing every active divergence, as it did before it listed the first
``listing.SHOWN``, both timed in the same run.

``--gapped``: every rank's first record is missing (as after a restart of the head node that
lost what was in flight, with no agent to resend it), so every rank is odd; "status_remade" is
``/api/status`` with the big run's odd ranks made again for each read, as before they were kept
(``DigestCache.odd``), timed in the same run.

``--divergent N``: one rank in N is far off on the loss as well, so that many divergences are
active at once (a fault shared by many cards: a bad batch of hosts, a rack's slow link);
"divergences" is how many. With ``--nan`` those ranks' loss and gradient norms are NaN at the
last step instead: ``--divergent 1 --nan`` is the cascade after one card's NaN, every rank
non-finite at once.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from rankwatch.agent.wire.records import Heartbeat, StepRecord
from rankwatch.aggregator.divergence.listing import list_active
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.dashboard.app import create_app

METRIC_NAMES = ("loss", "lr", "throughput", "step_time", "grad_norm", "grad_norm_local",
                "update_ratio", "tokens_per_s")  # fmt: skip
NAN_METRICS = ("loss", "grad_norm", "grad_norm_local", "update_ratio")  # NaN after a NaN
RANKS_PER_NODE = 8
STEADY_S = 3600.0


class TimedLock:
    """The service's RLock, noting how long each outermost hold lasted."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._t0 = 0.0
        self.holds: list[float] = []

    def __enter__(self) -> TimedLock:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(time.perf_counter() - self._t0)
        self._lock.release()

    def acquire(self, *a: Any, **k: Any) -> bool:
        return self._lock.acquire(*a, **k)

    def release(self) -> None:
        self._lock.release()


def rss_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fill(
    agg: Aggregator,
    ranks: int,
    steps: int,
    metrics: int,
    gapped: bool = False,
    odd: int = 0,
    nan: bool = False,
) -> None:
    """``steps`` steps of every rank and one heartbeat each, arriving now; rank 3 (and one in
    ``odd`` ranks, when given) is far off on the loss, or NaN on the loss and gradient norms
    from the last step with ``nan``. ``gapped``: each rank's seq 1 never arrives."""
    names = METRIC_NAMES[:metrics]
    seq = 0
    for step in range(1 + gapped, steps + 1 + gapped):
        batch: list[Any] = []
        t = time.time()
        for rank in range(ranks):
            values = {m: 1.0 + 0.01 * ((rank * 7 + step) % 13) for m in names}
            if (rank == 3 or (odd and rank % odd == 3 % odd)) and not nan:
                values["loss"] = 50.0
            elif (rank == 3 or (odd and rank % odd == 3 % odd)) and step == steps + gapped:
                values.update({m: math.nan for m in NAN_METRICS if m in values})
            batch.append(StepRecord("big", rank, step, t, ranks, f"node{rank // RANKS_PER_NODE}",
                                    100_000 + rank, step, 0, values))  # fmt: skip
        seq = step
        for i in range(0, len(batch), 4096):
            agg.add(batch[i : i + 4096], imported=False)
        agg.tick()
    beats = [Heartbeat("big", r, seq + 1, time.time(), steps, 5.0, 0) for r in range(ranks)]
    for i in range(0, len(beats), 4096):
        agg.add(beats[i : i + 4096], imported=False)


def timed(lock: TimedLock, fn: Any, repeat: int, before: Any = None) -> tuple[float, float, Any]:
    """Median wall ms of ``fn()`` and the longest lock hold (ms) during those calls (each after
    ``before()``, not timed)."""
    walls, holds, out = [], [], None
    for _ in range(repeat):
        if before is not None:
            before()
        lock.holds.clear()
        t = time.perf_counter()
        out = fn()
        walls.append((time.perf_counter() - t) * 1e3)
        holds.append(max(lock.holds, default=0.0) * 1e3)
    return statistics.median(walls), max(holds), out


def _remade(run: str, states: Any, now: float, key: Any, make: Any) -> tuple[list[int], int]:
    return make()  # type: ignore[no-any-return]


def measure(
    ranks: int,
    steps: int,
    metrics: int,
    repeat: int,
    gapped: bool = False,
    odd: int = 0,
    nan: bool = False,
) -> dict[str, float]:
    gc.collect()
    rss0 = rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        # steady state: no rank turns lost or stalled while a slow machine fills 100,000 of them
        cfg = ServeConfig(data_dir=Path(tmp), console_alerts=False, resend_gaps=False,
                          lost_after_s=STEADY_S, min_stall_s=STEADY_S)  # fmt: skip
        agg = Aggregator(cfg)
        lock = agg.lock = TimedLock()  # type: ignore[assignment]
        fill(agg, ranks, steps, metrics, gapped, odd, nan)
        agg.flush_store()
        gc.collect()
        rss = rss_bytes() - rss0
        provider = AggregatorProvider(agg)
        client = TestClient(create_app(provider), base_url="http://127.0.0.1")
        out: dict[str, float] = {"ranks": ranks, "rss_per_rank_kb": rss / ranks / 1024}
        out["divergences"] = len(agg.detector.active("big"))
        reads = (("status", "/api/status"), ("status_run", "/api/status?run=big"),
                 ("metrics", "/metrics"), ("divergence", "/api/runs/big/divergence"),
                 ("divergence_page", "/api/runs/big/divergence?offset=0&limit=1000"))  # fmt: skip
        for name, path in reads:
            # each read just after a tick, as in a server (a sweep of every rank is the tick's)
            wall, hold, resp = timed(lock, lambda p=path: client.get(p), repeat, agg.tick)
            assert resp.status_code == 200, (path, resp.status_code, resp.text[:200])
            out[f"{name}_ms"], out[f"{name}_lock_ms"] = wall, hold
            out[f"{name}_kb"] = len(resp.content) / 1024
        # what /divergence built before it listed ranks as /api/status does: every rank's entry
        every = lambda: provider.snapshot(run="big", ranks=True)  # noqa: E731
        wall, hold, _ = timed(lock, every, repeat, agg.tick)
        out["divergence_every_rank_ms"], out["divergence_every_rank_lock_ms"] = wall, hold
        # what /api/status sent before it listed the first of the active divergences: all of
        # them, gathered for each read
        listing = agg.detector.listing
        agg.detector.listing = lambda run: list_active(  # type: ignore[method-assign]
            agg.detector.active(run), limit=len(agg.detector.active(run))
        )
        wall, hold, resp = timed(lock, lambda: client.get("/api/status"), repeat, agg.tick)
        out["status_every_divergence_ms"], out["status_every_divergence_lock_ms"] = wall, hold
        out["status_every_divergence_kb"] = len(resp.content) / 1024
        agg.detector.listing = listing  # type: ignore[method-assign]
        if gapped:
            kept = agg.digests.odd
            agg.digests.odd = _remade  # type: ignore[method-assign]
            wall, hold, _ = timed(lock, lambda: client.get("/api/status"), repeat, agg.tick)
            out["status_remade_ms"], out["status_remade_lock_ms"] = wall, hold
            agg.digests.odd = kept  # type: ignore[method-assign]
        wall, hold, _ = timed(lock, agg.tick, repeat * 5, lambda: time.sleep(0.2))
        out["tick_ms"], out["tick_lock_ms"] = wall, hold
        sweep = time.perf_counter()
        agg.health.snapshot(time.time())
        out["sweep_ms"] = (time.perf_counter() - sweep) * 1e3
        agg.store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4096,16384,100000", help="comma-separated sizes")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--metrics", type=int, default=8, choices=range(1, len(METRIC_NAMES) + 1))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gapped", action="store_true", help="every rank's first record missing")
    ap.add_argument(
        "--divergent",
        type=int,
        default=0,
        metavar="N",
        help="one rank in N far off on the loss (0: rank 3 only)",
    )
    ap.add_argument("--nan", action="store_true",
                    help="those ranks NaN at the last step (--divergent 1: all)")  # fmt: skip
    args = ap.parse_args()
    if args.divergent < 0:
        ap.error(f"--divergent must be 0 or more, got {args.divergent}")
    rows = [measure(int(n), args.steps, args.metrics, args.repeat, args.gapped, args.divergent,
                    args.nan) for n in args.ranks.split(",")]  # fmt: skip
    base = rows[0]
    cols: tuple[str, ...] = (
        "divergences", "status_ms", "status_lock_ms", "status_kb", "status_run_ms",
        "status_run_lock_ms", "status_run_kb", "metrics_ms", "metrics_lock_ms", "metrics_kb",
        "divergence_ms",
        "divergence_lock_ms", "divergence_kb", "divergence_page_ms", "divergence_every_rank_ms",
        "divergence_every_rank_lock_ms", "status_every_divergence_ms",
        "status_every_divergence_lock_ms", "status_every_divergence_kb", "tick_ms",
        "tick_lock_ms", "sweep_ms", "rss_per_rank_kb",
    )  # fmt: skip
    if args.gapped:
        cols = ("status_remade_ms", "status_remade_lock_ms", *cols)
    print(f"status_cost: {args.steps} steps x {args.metrics} metrics per rank"
          f"{', every rank gapped' if args.gapped else ''}"
          f"{f', one rank in {args.divergent} divergent' if args.divergent else ''}"
          f"{' (NaN at the last step)' if args.nan else ''}; median of "
          f"{args.repeat} (tick: of {args.repeat * 5}); lock = longest hold")  # fmt: skip
    print(f"{'ranks':>8} " + " ".join(f"{c:>18}" for c in cols))
    for row in rows:
        cells = " ".join(f"{row[c]:>10.1f} ({row[c] / max(base[c], 1e-9):4.1f}x)" for c in cols)
        print(f"{int(row['ranks']):>8,} {cells}")


if __name__ == "__main__":
    main()
