"""HTTP latency of ``rankwatch serve`` per request: one keep-alive connection, fresh
connections, and many keep-alive clients at once.

    python bench/http_keepalive.py [--requests 100] [--clients 100] [--per-client 10]

Two servers on 127.0.0.1, each a child process serving the real dashboard app over a real
aggregator and store: ``rankwatch serve`` itself (``bench/serve_proc.py``), and, as the
baseline measured in the same run, plain uvicorn serving the same app from a socket it binds
itself. Each case sends ``GET /api/status`` (a small response: the case where a delayed ACK
shows) from ``http.client``; the concurrent case runs ``--clients`` threads that each send
``--per-client`` requests on their own keep-alive connection. Printed: p50 and p95 per request,
and the ratio rankwatch / uvicorn.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_proc import ServeProc

PATH = "/api/status"
TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0

PLAIN_UVICORN = """
import socket, sys, uvicorn
from pathlib import Path
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.dashboard.app import create_app
probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
agg = Aggregator(ServeConfig(data_dir=Path(sys.argv[1]), ingest_host="127.0.0.1", ingest_port=0,
                             console_alerts=False))
agg.start()
print(f"PORT {port}", flush=True)
try:
    uvicorn.run(create_app(AggregatorProvider(agg)), host="127.0.0.1", port=port,
                log_level="warning", timeout_graceful_shutdown=1)
finally:
    agg.stop()
"""


@contextmanager
def plain_uvicorn(data_dir: Path) -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PLAIN_UVICORN, str(data_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        wait_listening(port)
        yield port
    finally:
        proc.terminate()
        proc.wait(TIMEOUT_S)


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            one_request(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def one_request(port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        return timed(conn)
    finally:
        conn.close()


def timed(conn: http.client.HTTPConnection) -> float:
    t0 = time.perf_counter()
    conn.request("GET", PATH)
    res = conn.getresponse()
    res.read()
    assert res.status == 200, res.status
    return time.perf_counter() - t0


def keepalive(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        timed(conn)  # the first request on a connection is not the case measured
        return [timed(conn) for _ in range(n)]
    finally:
        conn.close()


def fresh(port: int, n: int) -> list[float]:
    return [one_request(port) for _ in range(n)]


def concurrent(port: int, clients: int, per_client: int) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        try:
            timed(conn)
            start.wait(TIMEOUT_S)
            got = [timed(conn) for _ in range(per_client)]
        finally:
            conn.close()
        with lock:
            out.extend(got)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * per_client)
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-client", type=int, default=10)
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[int], list[float]]]] = [
        ("one keep-alive connection", lambda p: keepalive(p, args.requests)),
        ("a fresh connection each", lambda p: fresh(p, args.requests)),
        (
            f"{args.clients} keep-alive clients at once",
            lambda p: concurrent(p, args.clients, args.per_client),
        ),
    ]
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with ServeProc(Path(tmp) / "serve") as serve:
            wait_listening(serve.http_port)
            results["rankwatch"] = {name: run(serve.http_port) for name, run in cases}
        with plain_uvicorn(Path(tmp) / "plain") as port:
            results["uvicorn"] = {name: run(port) for name, run in cases}
    print(f"GET {PATH}, ms per request (p50 / p95); ratio = rankwatch serve / plain uvicorn")
    for name, _ in cases:
        ours, base = results["rankwatch"][name], results["uvicorn"][name]
        print(
            f"  {name:32} rankwatch {pct(ours, 50):7.2f} / {pct(ours, 95):7.2f}   "
            f"uvicorn {pct(base, 50):7.2f} / {pct(base, 95):7.2f}   "
            f"ratio p50 {pct(ours, 50) / pct(base, 50):5.2f}"
        )


if __name__ == "__main__":
    main()
