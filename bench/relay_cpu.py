"""The head node's CPU per record, with every rank connected to it and with per-node relays.

    python bench/relay_cpu.py [--ranks 1024] [--nodes 8] [--rate 5] [--duration 20] [--rounds 3]

Each phase starts a fresh ``rankwatch serve`` (real aggregator, real DuckDB store) and runs the
load generator (``bench/loadgen.py``, one DEALER per simulated rank, as real agents do):

* direct (the baseline): every rank connects to the aggregator;
* relayed: ``--nodes`` ``rankwatch relay`` processes, the ranks split across them in blocks, each
  relay forwarding to the aggregator in batches of up to ``--batch-ms``.

The aggregator's CPU time (all threads, from ``/proc/<pid>/stat``) is read before the load and
once it is idle again after it (backlog drained), minus its idle CPU rate measured beforehand,
and divided by the records it accepted. Relays' own CPU is reported per record too. Everything
runs on this machine, so the processes compete for its cores; CPU time, not wall time, is
what is compared, and the phases alternate for ``--rounds`` rounds (medians reported).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadgen import LoadConfig, LoadGen
from serve_proc import ServeProc, proc_cpu_s

MEDIANS = ("us_per_record", "raw_us_per_record", "relay_us_per_record", "messages", "accepted")
IDLE_MEASURE_S = 5.0  # the aggregator's idle CPU rate is measured over this long
DRAIN_TIMEOUT_S = 600.0
RELAY_START_TIMEOUT_S = 30.0


def start_relays(n: int, upstream: str, batch_ms: float) -> list[tuple[subprocess.Popen[str], str]]:
    out = []
    for _ in range(n):
        proc = subprocess.Popen(
            [sys.executable, "-c", "from rankwatch.cli.main import main; main()", "relay",
             "--listen", "tcp://127.0.0.1:0", "--upstream", upstream,
             "--batch-ms", str(batch_ms), "--report-s", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        m = re.search(r"agents connect to (tcp://\S+),", banner)
        if not m:
            proc.kill()
            raise RuntimeError(f"relay did not start: {banner!r}")
        out.append((proc, m.group(1)))
    return out


def stop_relays(relays: list[tuple[subprocess.Popen[str], str]]) -> list[str]:
    lines = []
    for proc, _ in relays:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        lines.append(out.strip().splitlines()[-1] if out.strip() else "")
    return lines


def phase(args: argparse.Namespace, relayed: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, ServeProc(Path(tmp) / "data") as head:
        head.wait_idle(60.0)
        c0, t0 = head.cpu_s(), time.monotonic()
        time.sleep(IDLE_MEASURE_S)
        idle_rate = (head.cpu_s() - c0) / (time.monotonic() - t0)
        relays = start_relays(args.nodes, head.addr, args.batch_ms) if relayed else []
        try:
            addrs = [addr for _, addr in relays] or [head.addr]
            config = LoadConfig(
                ranks=args.ranks, rate=args.rate, duration=args.duration, addrs=addrs,
                procs=args.procs, sockets="rank", seed=args.seed, run="relay-cpu",
                ranks_per_node=max(1, args.ranks // args.nodes),
            )  # fmt: skip
            gen = LoadGen(config)
            relay_cpu0 = sum(proc_cpu_s(p.pid) for p, _ in relays)
            cpu0, t0 = head.cpu_s(), time.monotonic()
            gen.start()
            summary = gen.wait()
            sent_done = time.monotonic()
            head.wait_idle(DRAIN_TIMEOUT_S)
            relay_cpu = sum(proc_cpu_s(p.pid) for p, _ in relays) - relay_cpu0
            cpu, elapsed = head.cpu_s() - cpu0, time.monotonic() - t0
            drain_s = time.monotonic() - sent_done
        finally:
            relay_lines = stop_relays(relays)
        counters = head.counters()
    accepted = counters.get("records_accepted", 0.0)
    net = cpu - idle_rate * elapsed
    return {
        "sent": summary["records"],
        "agent_frames": summary["frames"],
        "accepted": accepted,
        "messages": counters.get("ingest_messages", 0.0),
        "connections": counters.get("ingest_connections", 0.0),
        "cpu_s": cpu,
        "idle_rate": idle_rate,
        "elapsed_s": elapsed,
        "drain_s": drain_s,
        "us_per_record": net / max(accepted, 1) * 1e6,
        "raw_us_per_record": cpu / max(accepted, 1) * 1e6,
        "relay_us_per_record": relay_cpu / max(accepted, 1) * 1e6,
        "relay_lines": relay_lines,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=8, help="relays (one per simulated node)")
    ap.add_argument("--rate", type=float, default=5.0, help="steps per second per rank")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per phase")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--batch-ms", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="direct/relayed pairs, alternated")
    args = ap.parse_args()
    print(
        f"relay_cpu: {args.ranks} ranks x {args.rate:g} steps/s x {args.duration:g} s per phase; "
        f"relayed: {args.nodes} relays, batches of {args.batch_ms:g} ms",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "relayed": []}
    for round_no in range(1, args.rounds + 1):  # alternate, so machine noise hits both alike
        for name, relayed in (("direct", False), ("relayed", True)):
            r = phase(args, relayed)
            runs[name].append(r)
            print(
                f"round {round_no} {name:8s}: sent {r['sent']:,}, accepted {r['accepted']:,.0f}, "
                f"head got {r['messages']:,.0f} messages over {r['connections']:,.0f} "
                f"connections; head CPU {r['cpu_s']:.1f} s in {r['elapsed_s']:.0f} s (idle "
                f"{r['idle_rate'] * 100:.1f} % of a core; drained {r['drain_s']:.1f} s after the "
                f"load) -> {r['us_per_record']:.1f} us/record net "
                f"({r['raw_us_per_record']:.1f} raw)"
                + (f"; relays {r['relay_us_per_record']:.1f} us/record" if relayed else ""),
                flush=True,
            )
    d = {k: statistics.median(r[k] for r in runs["direct"]) for k in MEDIANS}
    rl = {k: statistics.median(r[k] for r in runs["relayed"]) for k in MEDIANS}
    spread = {}
    for name, rs in runs.items():
        per = [r["us_per_record"] for r in rs]
        spread[name] = f"{min(per):.1f}..{max(per):.1f}"
    print(
        f"head CPU per record (median of {args.rounds}): direct {d['us_per_record']:.1f} us "
        f"(range {spread['direct']}), relayed {rl['us_per_record']:.1f} us (range "
        f"{spread['relayed']}), ratio {d['us_per_record'] / rl['us_per_record']:.2f}x; head "
        f"messages per record {d['messages'] / max(d['accepted'], 1):.3f} vs "
        f"{rl['messages'] / max(rl['accepted'], 1):.4f}; relays' own CPU "
        f"{rl['relay_us_per_record']:.1f} us/record (spent on the worker nodes)"
    )
    for line in runs["relayed"][-1]["relay_lines"][:2]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
