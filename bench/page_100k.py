"""The page's reads at 100,000 ranks, against a real `rankwatch serve` over a real store.

Fills a store through the Store API (tests/dashboard/bigrun.py: 100,000 ranks x 3 steps, one
culprit, one crashed rank, an incident), starts `rankwatch serve` on it and times each read
the page makes to become usable (the run list, the table's first page, the node map, the
chart), the table's next pages (sorted, filtered: the clicks), and, as the baseline measured
in the same run, the whole rank table the page read before (`/api/run/ranks` without paging).
With --browser, also the time until headless Chromium has the page ready. Before ``serve``
starts, the detector's z of the run's latest values is timed in this process both ways, the
table's (columns, ``latest_z_columns``) and the baseline of a dict per rank (``latest_z``, what
the table built before), on the same values, with their ratio. Each read is timed
in wall time and in the CPU ``serve`` spent on it (the machine is shared: wall time waits for
other jobs); ``--rounds`` starts ``serve`` afresh that many times on the one store (every "first"
read is a first read again) and prints each figure's median and range over the rounds.

    python bench/page_100k.py [--ranks 100000] [--rounds 3] [--browser]

Targets (issue 24): the page usable within 1 s of asking, each click's page within 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rankwatch.aggregator.store.db import Store  # noqa: E402
from rankwatch.dashboard import views  # noqa: E402

from tests.dashboard.bigrun import BigRun, fill  # noqa: E402
from tests.dashboard.procs import Server  # noqa: E402

USABLE_TARGET_S = 1.0
CLICK_TARGET_S = 0.3
CHROMIUM = "/usr/bin/chromium"


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Timing = tuple[float, float, int]  # wall s, serve's CPU s, answer bytes


class Reader:
    """GETs against one ``serve``, each timed in wall time and in the server's CPU."""

    def __init__(self, client: httpx.Client, pid: int) -> None:
        self.client = client
        self.pid = pid

    def __call__(self, path: str, **params: object) -> Timing:
        cpu = cpu_s(self.pid)
        started = time.perf_counter()
        res = self.client.get(path, params=params)
        res.raise_for_status()
        took = time.perf_counter() - started
        return took, cpu_s(self.pid) - cpu, len(res.content)


def browser_ready(url: str, run: str) -> float:
    from urllib.parse import quote

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = b.new_page(viewport={"width": 1280, "height": 800})
        started = time.perf_counter()
        page.goto(f"{url}/#run={quote(run, safe='')}")
        page.wait_for_function("() => window.rankwatch && window.rankwatch.ready", timeout=120_000)
        page.wait_for_function("() => document.querySelectorAll('#rank-body tr').length > 0")
        took = time.perf_counter() - started
        b.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=1, help="serve started afresh this often")
    ap.add_argument("--browser", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 9:
        ap.error("--rounds: from 1 to 9")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        started = time.perf_counter()
        big, _ = fill(data, world=args.ranks)
        took = time.perf_counter() - started
        print(f"fill: {args.ranks:,} ranks x {big.steps} steps in {took:.2f} s")
        z_both_ways(data, big)
        rounds = [one_round(data, big, args.browser) for _ in range(args.rounds)]
    report(rounds)


def z_both_ways(data: Path, big: BigRun, repeats: int = 7) -> None:
    """The z of the run's latest loss values, as the table computes it and as a dict per rank
    (the baseline), median CPU of ``repeats`` each, alternating."""
    with Store(data) as store:
        ranks, values = store.latest_values(big.run, "loss")
    columns, dicts = [], []
    for _ in range(repeats):
        started = time.process_time()
        views.latest_z_columns(ranks, values, "loss")
        columns.append(time.process_time() - started)
        started = time.process_time()
        views.latest_z(dict(zip(ranks.tolist(), values.tolist(), strict=True)), "loss")
        dicts.append(time.process_time() - started)
    col, base = statistics.median(columns), statistics.median(dicts)
    print(f"z of {len(ranks):,} latest values, CPU: columns {col * 1e3:.0f} ms, baseline (a dict "
          f"per rank) {base * 1e3:.0f} ms, ratio {col / base:.2f}")  # fmt: skip


def one_round(data: Path, big: BigRun, browser: bool) -> dict[str, Timing]:
    started = time.perf_counter()
    srv = Server(data)
    pid = srv.proc.pid
    print(f"serve: answers in {time.perf_counter() - started:.2f} s, {cpu_s(pid):.2f} s CPU")
    try:
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            before = cpu_s(pid)
            got = measure(Reader(client, pid), big)
            if browser:
                cpu = cpu_s(pid)
                ready = browser_ready(srv.url, big.run)
                # Chromium's own reads: a fresh page asks again (kept answers are reused)
                got[CHROMIUM_READY] = (ready, cpu_s(pid) - cpu, 0)
            print(f"serve: {cpu_s(pid) - before:.2f} s CPU for the reads of this round")
            return got
    finally:
        srv.stop()


FIRST = ("runs (first)", "table page 1 (first)", "node map (first)", "chart: band + incident")
BASELINE = "baseline: the whole table"
CHROMIUM_READY = "Chromium: page ready"
STATUS = "status (first: every run)"
NOT_CLICKS = (BASELINE, CHROMIUM_READY, STATUS)


def measure(get: Reader, big: BigRun) -> dict[str, Timing]:
    run = {"run": big.run}
    block = f"{big.culprit // 8 * 8}-{big.culprit // 8 * 8 + 7}"
    ranks = "/api/run/ranks"
    out = {
        FIRST[0]: get("/api/runs"),
        FIRST[1]: get(ranks, **run, page=1),
        FIRST[2]: get("/api/run/nodes", **run),
        FIRST[3]: get("/api/run/series", **run, metric="loss", format="bin"),
        "next page": get(ranks, **run, page=2),
        "sort by rank, desc": get(ranks, **run, sort="rank", desc=1),
        "sort by z": get(ranks, **run, sort="z"),
        "sort by rank again": get(ranks, **run, sort="rank", desc=1),
        "filter crashed": get(ranks, **run, filter="crashed"),
        "drill down (rank block)": get(ranks, **run, filter=block),
        "node map (kept)": get("/api/run/nodes", **run),
        "runs (again)": get("/api/runs"),
        STATUS: get("/api/status"),
    }
    out[BASELINE] = get(ranks, **run)
    return out


def _fig(values: list[float], scale: float) -> str:
    mid = statistics.median(values) * scale
    if len(values) == 1:
        return f"{mid:8.0f}"
    return f"{mid:8.0f} ({min(values) * scale:.0f}–{max(values) * scale:.0f})"


def report(rounds: list[dict[str, Timing]]) -> None:
    """Each read's median wall and CPU over the rounds (range in brackets), its size, and the
    ratio of its median wall to the baseline's in the same rounds."""
    base = statistics.median(r[BASELINE][0] for r in rounds)
    print(f"{len(rounds)} round(s); medians (min–max)")
    print(f"  {'read':28s} {'wall, ms':>22s} {'serve CPU, ms':>22s} {'kB':>9s} {'/ baseline':>10s}")
    for name in rounds[0]:
        walls = [r[name][0] for r in rounds]
        cpus = [r[name][1] for r in rounds]
        size = statistics.median(r[name][2] for r in rounds) / 1e3
        ratio = statistics.median(walls) / base
        print(f"  {name:28s} {_fig(walls, 1e3):>22s} {_fig(cpus, 1e3):>22s} {size:9.1f} "
              f"{ratio:10.3f}")  # fmt: skip
    usable = [sum(r[k][0] for k in FIRST) for r in rounds]
    usable_cpu = [sum(r[k][1] for k in FIRST) for r in rounds]
    clicks = [max(t[0] for k, t in r.items() if k not in (*FIRST, *NOT_CLICKS))
              for r in rounds]  # fmt: skip
    print(f"page usable (its first reads one after another): {statistics.median(usable):.2f} s "
          f"wall, {statistics.median(usable_cpu):.2f} s serve CPU "
          f"(target {USABLE_TARGET_S} s)")  # fmt: skip
    print(f"slowest click: {statistics.median(clicks) * 1000:.0f} ms "
          f"(target {CLICK_TARGET_S * 1000:.0f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
