"""Freshness: wall time from ``Monitor.log()`` in a rank to the step first drawn in a chart.

Real parts end to end: ``rankwatch serve`` in a subprocess, N ranks as agent processes (real
``Monitor`` over ZeroMQ), the dashboard in headless Chromium. Each step is logged by every rank
at a known wall time; the page records when each step is first drawn (``firstDrawn`` in
``window.rankwatch``, set right after ECharts' ``setOption``). The baseline, measured in the same
run, is when the same step's points reach a plain Server-Sent Events client in this process: the
server's push latency without a browser. Same machine, same clock.

    python bench/freshness.py [--ranks 4] [--steps 60] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from bench.stream import step_arrivals
from tests.dashboard.procs import Rank, Server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
RUN = "freshness"
METRIC = "loss"
SETTLE_S = 3.0  # after the last step, how long to wait for stragglers


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between steps")
    args = parser.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("needs playwright (pip install rankwatch[dev])", file=sys.stderr)
        return 2
    if not Path(CHROMIUM).exists():
        print(f"needs Chromium at {CHROMIUM}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="rankwatch-bench-") as tmp:
        server = Server(Path(tmp) / "data")
        ranks = [Rank(server, RUN, r, args.ranks, Path(tmp) / "logs") for r in range(args.ranks)]
        logged: dict[int, float] = {}
        arrived: dict[int, float] = {}
        stop = threading.Event()
        try:
            for rank in ranks:
                rank.log(1, **{METRIC: 1.0})
            server.wait_for("the run", lambda: server.get(f"/api/runs/{RUN}/metrics")["metrics"])
            listener = threading.Thread(
                target=step_arrivals, args=(server.url, RUN, METRIC, arrived, stop), daemon=True
            )
            listener.start()
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"{server.url}/#run={RUN}")
                page.wait_for_function("() => window.rankwatch && window.rankwatch.ready")
                for step in range(2, args.steps + 2):
                    start = time.monotonic()
                    times = [
                        rank.log(step, **{METRIC: 1.0 / step + 0.01 * i})
                        for i, rank in enumerate(ranks)
                    ]
                    logged[step] = min(times)
                    time.sleep(max(0.0, args.interval - (time.monotonic() - start)))
                time.sleep(SETTLE_S)
                drawn_ms = page.evaluate(f"() => window.rankwatch.firstDrawn[{METRIC!r}] || {{}}")
                browser.close()
        finally:
            stop.set()
            for rank in ranks:
                rank.close()
            server.stop()

    drawn = {int(k): v / 1000 for k, v in drawn_ms.items()}
    chart = [drawn[s] - t for s, t in logged.items() if s in drawn]
    push = [arrived[s] - t for s, t in logged.items() if s in arrived]
    missing = [s for s in logged if s not in drawn]
    print(f"freshness, log() -> first drawn in Chromium ({args.ranks} ranks, "
          f"{len(logged)} steps every {args.interval} s)")  # fmt: skip
    if not chart or not push:
        print("no measurements: the chart or the stream saw no steps", file=sys.stderr)
        return 1
    for name, values in (("chart (browser)", chart), ("baseline: SSE client", push)):
        print(
            f"  {name:22s} median {statistics.median(values) * 1000:7.1f} ms"
            f"   p95 {pct(values, 0.95) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms"
            f"   n={len(values)}"
        )
    ratio = statistics.median(chart) / statistics.median(push)
    print(f"  ratio chart/baseline (median): {ratio:.2f}")
    if missing:
        print(f"  steps never drawn: {missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
