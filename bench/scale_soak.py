"""Soak: N simulated ranks at R steps/s for D seconds against a real ``rankwatch serve``.

    python bench/scale_soak.py [--ranks 4096] [--rate 5] [--duration 600] [--sockets process]
                               [--faults drift:17:4,nan:5,slow:40:2,hang:77,lost:100]

Measures, from one run:

* backlog: records sent by the load generator vs accepted by the aggregator (``/metrics``) vs
  stored (``/api/runs``), every ``--poll-s``; the drain time after the load ends;
* divergence for every step: ``merge_late`` and ``merge_evicted`` stay 0 when every
  (metric, step) group was scored; and the injected faults are flagged (``/api/runs/<run>``);
* freshness: a client subscribed to ``/api/stream`` (what the dashboard does) notes when each
  ``loss`` point of ``SAMPLED_RANKS`` sampled ranks arrives; freshness = arrival minus the
  record's creation time (same clock: everything runs on this machine);
* the aggregator's RSS and CPU (``/proc``), and its CPU per record beside the baseline's: the
  same load (``--bare-s`` seconds of it, before the aggregator's run) sent to a bare receive loop
  (``bench/bare_receive.py``: a ROUTER decoding each frame, nothing else), measured the same way.

``--sockets process`` (default) sends each load process's ranks over one connection, batched per
step, as relays would; ``--sockets rank`` opens one connection per rank. The default size is
beyond a 2-core machine: shrink it with the flags and report what it sustains.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from loadgen import LoadGen, add_arguments, config_from_args
from serve_proc import ServeProc

BARE = Path(__file__).with_name("bare_receive.py")

SAMPLED_RANKS = 64  # ranks whose loss points are timed on the live stream
DRAIN_TIMEOUT_S = 300.0
DEFAULT_FAULTS = "drift:17:4,nan:5,slow:40:2,hang:77,lost:100"


class StreamClock:
    """Reads /api/stream in a thread; notes arrival times of sampled ranks' loss points."""

    def __init__(self, head: ServeProc, run: str, ranks: set[int]) -> None:
        self.head, self.run, self.ranks = head, run, ranks
        self.arrivals: dict[tuple[int, int], float] = {}
        self.points = self.frames = self.resyncs = self.sampled_msgs = 0
        self.error = ""
        self.connected = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for _ in range(50):  # the banner comes just before uvicorn listens
            try:
                self._stream()
                return
            except ConnectionRefusedError as exc:
                self.error = repr(exc)
                time.sleep(0.2)

    def _stream(self) -> None:
        try:
            for event, data in self.head.stream(timeout_s=DRAIN_TIMEOUT_S):
                now = time.time()
                self.connected.set()
                if event == "resync":
                    self.resyncs += 1
                if event != "feed":
                    continue
                self.frames += 1
                for msg in json.loads(data):
                    if msg.get("type") != "points" or msg.get("run") != self.run:
                        continue
                    self.points += len(msg["points"])
                    self.sampled_msgs += bool(msg.get("sampled"))
                    if msg.get("metric") != "loss":
                        continue
                    for rank, step, _ in msg["points"]:
                        if rank in self.ranks:
                            self.arrivals.setdefault((rank, step), now)
        except ConnectionRefusedError:
            raise
        except Exception as exc:  # the server stopping ends the stream
            self.error = repr(exc)


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))] if xs else float("nan")


def chart_ms(head: ServeProc, run: str) -> float:
    """Time of the dashboard's chart query for the loss over the whole run (band + outliers
    beyond 32 ranks, at most 2,000 points per line): should not grow with the steps stored."""
    t = time.perf_counter()
    try:
        head.get(f"/api/runs/{run}/series?metric=loss")
    except RuntimeError:  # 404 before the first flush
        return float("nan")
    return (time.perf_counter() - t) * 1e3


def timed_ms(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e3, out


def poll(head: ServeProc, gen: LoadGen, run: str, t0: float, cpu0: float) -> dict[str, Any]:
    metrics_ms, c = timed_ms(head.counters)  # GET /metrics: what a Prometheus scrape costs
    status_ms, _ = timed_ms(lambda: head.get("/api/status"))  # what `rankwatch status` reads
    return {
        "metrics_ms": metrics_ms,
        "status_ms": status_ms,
        "chart_ms": chart_ms(head, run),
        "steps": max((max(w.step_time, default=0) for w in gen.workers), default=0),
        "t": time.monotonic() - t0,
        "sent": gen.sent(),
        "accepted": int(c.get("records_accepted", 0)),
        "stored": head.stored(run),
        "late": int(c.get("merge_late", 0)),
        "evicted": int(c.get("merge_evicted", 0)),
        "feed_dropped": int(c.get("feed_dropped", 0)),
        "rss_mb": head.rss_bytes() / 2**20,
        "cpu_s": head.cpu_s() - cpu0,
    }


def show(p: dict[str, Any]) -> str:
    return (
        f"t={p['t']:6.0f} s  sent {p['sent']:>11,}  accepted {p['accepted']:>11,}  stored "
        f"{p['stored']:>11,}  backlog {p['sent'] - p['accepted']:>9,}  RSS {p['rss_mb']:6.0f} MB  "
        f"CPU {p['cpu_s']:7.1f} s  chart {p['chart_ms']:5.0f} ms  status {p['status_ms']:5.0f} ms  "
        f"/metrics {p['metrics_ms']:5.0f} ms"
    )


def bare_phase(config: Any, seconds: float) -> dict[str, float]:
    """CPU per record of a bare receive loop under ``seconds`` of the same load."""
    proc = subprocess.Popen(
        [sys.executable, str(BARE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port = int(proc.stdout.readline().split()[1])
        bare = dataclasses.replace(
            config, duration=seconds, run=f"{config.run}-bare", addrs=[f"tcp://127.0.0.1:{port}"]
        )
        gen = LoadGen(bare)
        gen.start()
        sent = gen.wait()["records"]
        time.sleep(1.0)  # the last frames in flight
        proc.stdin.close()
        words = proc.stdout.readline().split()  # records N frames M cpu_s S
        got, cpu = int(words[1]), float(words[5])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"sent": sent, "records": got, "cpu_s": cpu, "us": cpu / max(got, 1) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.set_defaults(ranks=4096, duration=600.0, sockets="process", faults=DEFAULT_FAULTS)
    ap.add_argument("--poll-s", type=float, default=10.0, help="backlog sample period")
    ap.add_argument("--bare-s", type=float, default=20.0, help="baseline load seconds (0: none)")
    args = ap.parse_args()
    try:
        config = config_from_args(args)
        config.check()
    except ValueError as exc:  # e.g. a default fault's rank beyond a small --ranks
        ap.error(f"{exc} (--faults names the fault ranks)")
    run = config.run
    stride = max(1, config.ranks // SAMPLED_RANKS)
    sampled = set(range(0, config.ranks, stride))
    print(
        f"scale_soak: {config.ranks:,} ranks x {config.rate:g} steps/s x {config.duration:g} s "
        f"({config.ranks * config.rate:,.0f} step records/s), {config.procs} load processes, "
        f"sockets per {config.sockets}, faults {args.faults or 'none'}",
        flush=True,
    )
    bare = bare_phase(config, args.bare_s) if args.bare_s > 0 else None
    if bare is not None:
        print(
            f"bare receive loop: {bare['records']:,} of {bare['sent']:,} records in "
            f"{args.bare_s:g} s, CPU {bare['cpu_s']:.2f} s = {bare['us']:.2f} us/record",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as tmp, ServeProc(Path(tmp) / "data") as head:
        config.addrs = [head.addr]  # --addr is the load generator's; here the target is ours
        clock = StreamClock(head, run, sampled)
        clock.connected.wait(15.0)
        gen = LoadGen(config)
        t0, cpu0, rss0 = time.monotonic(), head.cpu_s(), head.rss_bytes() / 2**20
        gen.start()
        samples: list[dict[str, Any]] = []
        health: dict[str, Any] = {}
        fault_rows: dict[int, tuple[str, Any]] = {}
        while any(w.proc.poll() is None for w in gen.workers):
            time.sleep(args.poll_s)
            samples.append(poll(head, gen, run, t0, cpu0))
            print(show(samples[-1]), flush=True)
            if time.monotonic() - t0 < config.duration - args.poll_s:
                with contextlib.suppress(RuntimeError):  # 404 until the first flush
                    # while the load still runs; a big run lists its odd ranks (the faults')
                    health = (head.get(f"/api/status?run={run}")["runs"] or [{}])[0]
                    fault_rows = fault_states(head, run, [f.rank for f in config.faults])
        summary = gen.wait()
        load_end = time.monotonic()
        sent = summary["records"]
        deadline = load_end + DRAIN_TIMEOUT_S
        last = poll(head, gen, run, t0, cpu0)
        while time.monotonic() < deadline and (last["accepted"] < sent or last["stored"] < sent):
            time.sleep(1.0)
            last = poll(head, gen, run, t0, cpu0)
        drain_s = time.monotonic() - load_end
        samples.append(last)
        print(show(last), flush=True)
        divergence = head.get(f"/api/runs/{run}/divergence")
        alerts = head.get(f"/api/alerts?run={run}&limit=10000")
        freshness = [
            t - created
            for (rank, step), t in clock.arrivals.items()
            if (created := gen.created(rank, step)) is not None
        ]
        report(
            config, summary, samples, drain_s, rss0, divergence, alerts, health, fault_rows,
            clock, freshness, bare,
        )  # fmt: skip


def fault_states(head: Any, run: str, ranks: list[int]) -> dict[int, tuple[str, Any]]:
    """(state, divergent metrics) of each fault rank, from its row of the rank table: a big
    run's status lists only the odd ranks it has room for, which need not be the faults'."""
    out: dict[int, tuple[str, Any]] = {}
    for rank in ranks:
        rows = head.get(f"/api/runs/{run}/ranks?filter={rank}&size=10")["rows"]
        out.update({r["rank"]: (r["state"], r.get("divergent")) for r in rows if r["rank"] == rank})
    return out


def report(
    config: Any,
    summary: dict[str, Any],
    samples: list[dict[str, Any]],
    drain_s: float,
    rss0: float,
    divergence: dict[str, Any],
    alerts: dict[str, Any],
    health: dict[str, Any],
    fault_rows: dict[int, tuple[str, Any]],
    clock: StreamClock,
    freshness: list[float],
    bare: dict[str, float] | None,
) -> None:
    sent, last = summary["records"], samples[-1]
    load_s = summary["elapsed_s"]
    during = [s for s in samples[:-1] if s["t"] <= load_s + 1]
    backlog = [s["sent"] - s["accepted"] for s in during] or [0]
    stored_lag = [s["sent"] - s["stored"] for s in during] or [0]
    per_s = config.ranks * config.rate
    print("--- results")
    print(
        f"load: sent {sent:,} records ({summary['by_kind']}) in {load_s:.0f} s = "
        f"{sent / load_s:,.0f} records/s; generator schedule lag p95 {summary['lag_p95_ms']:.0f} ms"
    )
    print(
        f"ingest: accepted {last['accepted']:,} ({last['accepted'] / sent:.2%} of sent), stored "
        f"{last['stored']:,} ({last['stored'] / sent:.2%}); backlog sent-accepted during the load: "
        f"max {max(backlog):,} records (= {max(backlog) / per_s:.1f} s of load), at its last "
        f"sample {backlog[-1]:,}; sent-stored max {max(stored_lag):,}; drained "
        f"{drain_s:.1f} s after the load ended"
    )
    cores = last["cpu_s"] / max(last["t"], 1e-9)
    rss_max = max(s["rss_mb"] for s in samples)
    print(
        f"aggregator: CPU {last['cpu_s']:.0f} s over {last['t']:.0f} s = {cores:.2f} cores "
        f"({last['cpu_s'] / max(last['accepted'], 1) * 1e6:.0f} us/record); RSS start "
        f"{rss0:.0f} MB, max {rss_max:.0f} MB, end {last['rss_mb']:.0f} MB"
    )
    if bare is not None:
        us = last["cpu_s"] / max(last["accepted"], 1) * 1e6
        print(
            f"CPU per record: aggregator {us:.1f} us, bare receive loop {bare['us']:.2f} us "
            f"(same load, this run): {us / max(bare['us'], 1e-9):.1f}x"
        )
    charts = [(s["steps"], s["chart_ms"]) for s in samples if s["chart_ms"] == s["chart_ms"]]
    if charts:
        (s_first, c_first), (s_last, c_last) = charts[0], charts[-1]
        print(
            f"chart query (loss, whole run): {c_first:.0f} ms at step {s_first:,}, "
            f"{c_last:.0f} ms at step {s_last:,} ({c_last / max(c_first, 1e-9):.2f}x for "
            f"{s_last / max(s_first, 1):.0f}x the steps); max {max(c for _, c in charts):.0f} ms"
        )
    verdict = "every (metric, step) scored" if last["late"] == last["evicted"] == 0 else "NOT all"
    flagged = sorted(
        {(d["rank"], d["metric"], d["kind"]) for d in divergence.get("divergences", [])}
    )
    during_ms = [(s["status_ms"], s["metrics_ms"]) for s in during] or [(0.0, 0.0)]
    print(
        f"reads during the load: GET /api/status median {pct([a for a, _ in during_ms], 0.5):.0f} "
        f"ms, max {max(a for a, _ in during_ms):.0f} ms; GET /metrics median "
        f"{pct([b for _, b in during_ms], 0.5):.0f} ms, max {max(b for _, b in during_ms):.0f} ms"
    )
    print(
        f"divergence: merge_late {last['late']}, merge_evicted {last['evicted']} -> {verdict}; "
        f"active at the end: {flagged[:12]}{' ...' if len(flagged) > 12 else ''}"
    )
    faults = {f.rank: f.kind for f in config.faults}
    states = {rank: fault_rows.get(rank, ("not in the rank table", None)) for rank in faults}
    others = {
        r["rank"]: r["divergent"]
        for r in health.get("ranks", [])
        if r["rank"] not in faults and r.get("divergent")
    }
    # every flag the run raised (the alert history), not only those active at one moment
    raised: dict[int, set[str]] = {}
    for a in alerts.get("history", []):
        if a["rule"] in ("divergence", "nonfinite") and a["state"] == "firing":
            for rank in [a["rank"]] if a["rank"] is not None else a.get("ranks", []):
                if rank not in faults:
                    raised.setdefault(rank, set()).add(a["metric"])
    print(
        f"fault ranks near the end of the load (state, divergent metrics): "
        f"{ {r: (faults[r], *states[r]) for r in sorted(faults)} }; "
        f"other ranks flagged (divergent metrics): {dict(list(others.items())[:10])}"
    )
    print(
        f"ranks without a fault that raised a divergence alert during the run: {len(raised)} "
        f"{ {r: sorted(m) for r, m in sorted(raised.items())[:10]} }"
    )
    if freshness:
        print(
            f"freshness (record made -> loss point on /api/stream), {len(freshness):,} points "
            f"of {SAMPLED_RANKS} sampled ranks: median {statistics.median(freshness) * 1e3:.0f} "
            f"ms, p95 {pct(freshness, 0.95) * 1e3:.0f} ms, max {max(freshness) * 1e3:.0f} ms; "
            f"stream: {clock.frames:,} frames, {clock.points:,} points, "
            f"{clock.sampled_msgs} sampled messages, {clock.resyncs} resyncs "
            f"(expected {config.steps * len(range(0, config.ranks, max(1, config.ranks // 64)))})"
        )
    else:
        print(f"freshness: no points arrived on /api/stream ({clock.error or 'no error'})")


if __name__ == "__main__":
    main()
