"""Memory and /api/status latency while large POST /api/ingest bodies arrive at once.

    python bench/http_bodies.py [--bodies 4] [--mb 40]

A real ``rankwatch serve`` in a child process; ``--bodies`` clients each post a ``--mb`` MB
body of JSON records at the same moment while another polls ``GET /api/status``. Measured: the
server's peak RSS over its idle RSS (``/proc``), the slowest status answer, and the answers to
the posts. Baseline, in the same run: the same server with the body budget switched off
(``Bodies.size`` patched to reserve nothing), as before the budget; ratio = budget / none.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_proc import proc_rss_bytes

TIMEOUT_S = 120.0
NO_BUDGET = "import rankwatch.dashboard.bodies as b; b.Bodies.size = lambda self, scope: 0; "


def start(data: Path, budget: bool) -> tuple[subprocess.Popen[str], int]:
    code = ("" if budget else NO_BUDGET) + "from rankwatch.cli.main import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--data", str(data), "--port", "0",
         "--ingest-host", "127.0.0.1", "--ingest-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"dashboard http://[^:]+:(\d+)/", line):
            port = int(m.group(1))
            break
    else:
        raise RuntimeError("rankwatch serve did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    deadline = time.monotonic() + 60
    while True:
        try:
            get(port, "/healthz")
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def get(port: int, path: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        t0 = time.perf_counter()
        conn.request("GET", path)
        conn.getresponse().read()
        return time.perf_counter() - t0
    finally:
        conn.close()


def post(port: int, body: bytes, out: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", "/api/ingest", body, {"Content-Type": "application/json"})
        res = conn.getresponse()
        res.read()
        out.append(res.status)
    except OSError:
        out.append(0)
    finally:
        conn.close()


def burst(port: int, pid: int, body: bytes, bodies: int) -> tuple[int, float, list[int]]:
    idle = proc_rss_bytes(pid)
    statuses: list[int] = []
    posts = [threading.Thread(target=post, args=(port, body, statuses)) for _ in range(bodies)]
    peak, slowest = idle, 0.0
    for t in posts:
        t.start()
    while any(t.is_alive() for t in posts):
        slowest = max(slowest, get(port, "/api/status"))
        peak = max(peak, proc_rss_bytes(pid))
        time.sleep(0.02)
    for t in posts:
        t.join()
    return peak - idle, slowest, sorted(statuses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=4)
    parser.add_argument("--mb", type=float, default=40.0)
    args = parser.parse_args()
    record = {"run": "bodies", "rank": 0, "kind": "nope", "pad": "x" * 200}
    n = int(args.mb * 1e6 / len(json.dumps(record)))
    body = json.dumps({"records": [record] * n}).encode()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, budget in (("no budget", False), ("budget", True)):
            proc, port = start(Path(tmp) / name.replace(" ", "_"), budget)
            try:
                results[name] = burst(port, proc.pid, body, args.bodies)
            finally:
                proc.terminate()
                proc.wait(TIMEOUT_S)
    print(f"{args.bodies} bodies of {len(body) / 1e6:.1f} MB at once ({n} records each)")
    for name, (extra, slowest, statuses) in results.items():
        print(
            f"  {name:9}  peak RSS +{extra / 1e6:7.0f} MB   slowest /api/status {slowest:6.2f} s"
            f"   answers {statuses}"
        )
    ratio = results["budget"][0] / max(1, results["no budget"][0])
    print(f"  ratio peak RSS budget / none: {ratio:.2f}")


if __name__ == "__main__":
    main()
