"""What the step of a NaN cascade costs the ingest thread while a page is open: one card's NaN at
step K, every card's at K + 1, each flagged non-finite on four metrics at once.

    python bench/cascade_step.py [--ranks 4096,16384,100000] [--steps 6] [--repeat 3]

A real ``Aggregator`` (real DuckDB store in a temporary folder, no sockets; the collector set
up as ``rankwatch serve`` sets it, ``tune_gc``) with one stream
subscriber (an open page, ``SUBSCRIBER_QUEUE_MAX`` queue) is fed ``--steps`` clean steps of 8
metrics per rank through ``add()`` and a tick after each, then the culprit's NaN step and the
cascade step. Printed per size, CPU ms (median of ``--repeat`` fills): ``add`` and ``tick`` of a
clean step and of the cascade step (and, on a line of its own, of the cascade tick's stages:
the alert engine, the incident tracker, the incident outlet, the health view), the stream
messages the cascade step queued, how many of
them were the step's points, and how many the subscriber lost (a page that lost any reads every
view again: a resync). "every" is the same with a stream message for every divergence, as before
the stream counted a step's divergences past the first ``FEED_DIVERGENCES``, in the same run
(the baseline of the ratio).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import rankwatch.aggregator.service as service
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.feed import divergence_messages, jsonable
from rankwatch.aggregator.service import Aggregator, ServeConfig, tune_gc

METRICS = ("loss", "lr", "throughput", "step_time", "grad_norm", "grad_norm_local",
           "update_ratio", "tokens_per_s")  # fmt: skip
NAN_METRICS = ("loss", "grad_norm", "grad_norm_local", "update_ratio")
CULPRIT = 2


def every_one(
    run: str, metric: str, step: int, state: str, items: Sequence[Divergence]
) -> list[dict[str, Any]]:
    """The stream before: a message per divergence."""
    return [{"type": "divergence", "state": state, **jsonable(d)} for d in items]


STAGES = (("alerts", "alerts", "evaluate"), ("incidents", "incidents", "observe"),
          ("outlet", "outlet", "judge"), ("health", "healthview", "snapshot"))  # fmt: skip


def timed_stages(agg: Aggregator, spent: dict[str, float]) -> None:
    """Wrap the tick's stages of ``agg`` so that each adds its CPU seconds to ``spent``."""
    for label, attr, method in STAGES:
        obj = getattr(agg, attr)
        inner = getattr(obj, method)

        def stage(*a: Any, _inner: Any = inner, _label: str = label, **k: Any) -> Any:
            t = time.process_time()
            try:
                return _inner(*a, **k)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.process_time() - t

        setattr(obj, method, stage)


def one_fill(ranks: int, steps: int) -> dict[str, float]:
    """CPU ms of a clean step's and the cascade step's add and tick (and of the tick's stages);
    the cascade's messages."""
    out: dict[str, float] = {}
    spent: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServeConfig(data_dir=Path(tmp), console_alerts=False, resend_gaps=False,
                          lost_after_s=3600.0, min_stall_s=3600.0)  # fmt: skip
        agg = Aggregator(cfg)
        tune_gc()  # as `rankwatch serve` runs it
        timed_stages(agg, spent)
        sub = agg.feed.subscribe()
        for step in range(1, steps + 3):
            t = time.time()
            batch = []
            for rank in range(ranks):
                values = {m: 1.0 + 0.01 * ((rank * 7 + step) % 13) for m in METRICS}
                if step == steps + 2 or (step == steps + 1 and rank == CULPRIT):
                    values.update(dict.fromkeys(NAN_METRICS, math.nan))
                batch.append(StepRecord("big", rank, step, t, ranks, f"node{rank // 8}",
                                        100_000 + rank, step, 0, values))  # fmt: skip
            sub.drain()
            dropped = sub.dropped
            c0 = time.process_time()
            for i in range(0, ranks, 4096):
                agg.add(batch[i : i + 4096], imported=False)
            c1 = time.process_time()
            spent.clear()
            agg.tick()
            c2 = time.process_time()
            if step == steps:
                out["clean_add_ms"], out["clean_tick_ms"] = (c1 - c0) * 1e3, (c2 - c1) * 1e3
            elif step == steps + 2:
                out["cascade_add_ms"], out["cascade_tick_ms"] = (c1 - c0) * 1e3, (c2 - c1) * 1e3
                kinds = Counter(m["type"] for m in sub.drain())
                out["messages"] = float(sum(kinds.values()))
                out["points_kept"] = float(kinds["points"])
                out["lost"] = float(sub.dropped - dropped)
                out.update({f"tick_{k}_ms": v * 1e3 for k, v in spent.items()})
        agg.store.close()
    return out


def measure(ranks: int, steps: int, repeat: int, messages: Callable[..., Any]) -> dict[str, float]:
    service.divergence_messages = messages  # type: ignore[attr-defined]
    try:
        fills = [one_fill(ranks, steps) for _ in range(repeat)]
    finally:
        service.divergence_messages = divergence_messages  # type: ignore[attr-defined]
    return {k: statistics.median(f.get(k, 0.0) for f in fills) for k in fills[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4096,16384,100000", help="comma-separated sizes")
    ap.add_argument("--steps", type=int, default=6, help="clean steps before the culprit's NaN")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.steps < 2 or args.repeat < 1:
        ap.error(
            f"--steps must be 2 or more and --repeat 1 or more, got {args.steps}, {args.repeat}"
        )
    cols = ("clean_add_ms", "clean_tick_ms", "cascade_add_ms", "cascade_tick_ms", "messages",
            "points_kept", "lost")  # fmt: skip
    print(f"cascade_step: {args.steps} clean steps x {len(METRICS)} metrics, then rank {CULPRIT}'s"
          f" NaN, then every rank's on {len(NAN_METRICS)} metrics; CPU ms, median of "
          f"{args.repeat}; now vs every (a stream message per divergence, same run)")  # fmt: skip
    print(f"{'ranks':>8} {'version':>7} " + " ".join(f"{c:>15}" for c in cols))
    for n in (int(x) for x in args.ranks.split(",")):
        every = measure(n, args.steps, args.repeat, every_one)
        now = measure(n, args.steps, args.repeat, divergence_messages)
        for name, row in (("every", every), ("now", now)):
            cells = " ".join(f"{row[c]:>15.1f}" for c in cols)
            print(f"{n:>8,} {name:>7} {cells}")
        ratio = every["cascade_add_ms"] / max(now["cascade_add_ms"], 1e-9)
        print(f"{n:>8,} {'ratio':>7} cascade add every / now = {ratio:.2f}x")
        parts = ", ".join(f"{label} {now.get(f'tick_{label}_ms', 0.0):.0f}" for label, *_ in STAGES)
        print(f"{n:>8,} {'stages':>7} the cascade tick's, now: {parts} ms")


if __name__ == "__main__":
    main()
