"""The page's reads at 100,000 ranks, against a real `rankwatch serve` over a real store.

Fills a store through the Store API (tests/dashboard/bigrun.py: 100,000 ranks x 3 steps, one
culprit, one crashed rank, an incident), starts `rankwatch serve` on it and times each read
the page makes to become usable (the run list, the table's first page, the node map, the
chart), the table's next pages (sorted, filtered: the clicks), and, as the baseline measured
in the same run, the whole rank table the page read before (`/api/run/ranks` without paging).
With --browser, also the time until headless Chromium has the page ready.

    python bench/page_100k.py [--ranks 100000] [--browser]

Targets (issue 24): the page usable within 1 s of asking, each click's page within 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dashboard.bigrun import BigRun, fill  # noqa: E402
from tests.dashboard.procs import Server  # noqa: E402

USABLE_TARGET_S = 1.0
CLICK_TARGET_S = 0.3
CHROMIUM = "/usr/bin/chromium"


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(client: httpx.Client, path: str, **params: object) -> tuple[float, int]:
    started = time.perf_counter()
    res = client.get(path, params=params)
    res.raise_for_status()
    return time.perf_counter() - started, len(res.content)


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
    ap.add_argument("--browser", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        started = time.perf_counter()
        big, _ = fill(data, world=args.ranks)
        took = time.perf_counter() - started
        print(f"fill: {args.ranks:,} ranks x {big.steps} steps in {took:.2f} s")
        started = time.perf_counter()
        srv = Server(data)
        pid = srv.proc.pid
        print(f"serve: answers in {time.perf_counter() - started:.2f} s, {cpu_s(pid):.2f} s CPU")
        try:
            with httpx.Client(base_url=srv.url, timeout=300) as client:
                before = cpu_s(pid)
                measure(client, big, srv.url, args.browser)
                print(f"serve: {cpu_s(pid) - before:.2f} s CPU for the reads above")
        finally:
            srv.stop()


def measure(client: httpx.Client, big: BigRun, url: str, browser: bool) -> None:
    run = {"run": big.run}
    block = f"{big.culprit // 8 * 8}-{big.culprit // 8 * 8 + 7}"
    ranks = "/api/run/ranks"
    first = {
        "runs (first: builds the stored ranks)": timed(client, "/api/runs"),
        "table page 1 (first: builds the rows)": timed(client, ranks, **run, page=1),
        "node map (first)": timed(client, "/api/run/nodes", **run),
        "chart: band + incident ranks": timed(
            client, "/api/run/series", **run, metric="loss", format="bin"
        ),
    }
    clicks = {
        "next page": timed(client, ranks, **run, page=2),
        "sort by rank, desc": timed(client, ranks, **run, sort="rank", desc=1),
        "sort by z": timed(client, ranks, **run, sort="z"),
        "sort by rank again": timed(client, ranks, **run, sort="rank", desc=1),
        "filter crashed": timed(client, ranks, **run, filter="crashed"),
        "drill down (rank block)": timed(client, ranks, **run, filter=block),
        "node map (kept)": timed(client, "/api/run/nodes", **run),
    }
    whole = timed(client, ranks, **run)
    for name, (took, size) in {**first, **clicks}.items():
        print(f"  {name:40s} {took * 1000:8.0f} ms {size / 1e3:9.1f} kB")
    usable = sum(t for t, _ in first.values())
    click = max(t for t, _ in clicks.values())
    print(f"baseline, the whole table in one answer: {whole[0] * 1000:.0f} ms, "
          f"{whole[1] / 1e6:.1f} MB")  # fmt: skip
    print(f"page usable (its reads one after another): {usable:.2f} s "
          f"(target {USABLE_TARGET_S} s)")  # fmt: skip
    print(f"slowest click: {click * 1000:.0f} ms (target {CLICK_TARGET_S * 1000:.0f} ms), "
          f"{whole[0] / click:.1f}x faster than the whole table")  # fmt: skip
    if browser:
        print(f"Chromium: page ready with its table in {browser_ready(url, big.run):.2f} s")


if __name__ == "__main__":
    main()
