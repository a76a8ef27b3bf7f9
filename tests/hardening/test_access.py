"""Access: the dashboard's default bind, the token on every route (the stream included), names
from the wire that must never become paths, and secrets that must never reach a log. Every
test runs a real `rankwatch serve`."""

from __future__ import annotations

import csv
import hmac
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import EventRecord, StepRecord

from .conftest import Spawner
from .procs import SERVE, parse_prom, wait_until

pytestmark = pytest.mark.timeout(90)

TOKEN = "tok-9f2c1d7e5b3a4c6d8e0f1a2b3c4d5e6f"
PREFIX = "rankwatch_aggregator_"


def _listening(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                if len(addr) == 8:
                    found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
                else:
                    found.add(addr)
    return found


def test_the_dashboard_listens_on_loopback_by_default(spawn: Spawner, report: Any) -> None:
    serve = spawn.serve(host=None)  # no --host flag, no config: the default
    assert "--host" not in serve.command()
    assert "dashboard http://127.0.0.1:" in serve.output()
    assert _listening(serve.port) == {"127.0.0.1"}
    report(kind="access", what="default dashboard bind", result="127.0.0.1 only")


def _get_paths(serve: Any) -> list[str]:
    spec = serve.get("/openapi.json")
    paths = []
    for path, ops in spec["paths"].items():
        if "get" in ops:
            paths.append(path.replace("{run}", "r").replace("{run:path}", "r"))
    return sorted(paths)


def test_the_token_guards_every_route_and_the_stream(spawn: Spawner, report: Any) -> None:
    # From the environment, so it is not in `ps` either.
    serve = spawn.serve(env={"RANKWATCH_TOKEN": TOKEN})
    serve.token = TOKEN
    paths = [*_get_paths(serve), "/", "/docs", "/openapi.json", "/static/app.js", "/nonexistent"]
    assert "/api/stream" in paths and "/metrics" in paths
    open_paths = {"/healthz"}
    refused = 0
    for path in paths:
        for headers, params in (
            ({}, {}),
            ({"Authorization": "Bearer wrong"}, {}),
            ({}, {"token": TOKEN[:-1]}),
            ({"Authorization": f"Bearer {TOKEN}x"}, {}),
            ({"Cookie": f"rankwatch_token={TOKEN[:8]}"}, {}),
        ):
            res = httpx.get(serve.url + path, headers=headers, params=params, timeout=10)
            want = 200 if path in open_paths else 401
            assert res.status_code == want, (path, headers, params, res.status_code)
            refused += res.status_code == 401
    res = httpx.post(serve.url + "/api/ingest", json={"records": []}, timeout=10)
    assert res.status_code == 401
    # With the token: the API answers and the stream streams.
    assert httpx.get(serve.url + "/api/status", headers=serve.headers()).status_code == 200
    with httpx.stream("GET", serve.url + "/api/stream", params={"token": TOKEN}, timeout=10) as s:
        assert s.status_code == 200
        assert "rankwatch_token=" in s.headers.get("set-cookie", "")
        assert any(line.startswith("event: hello") for line in _first_lines(s, 4))
    report(
        kind="access", what="--token: every route, the SSE stream, POST /api/ingest",
        result=f"{refused} requests without the right token refused (401), /healthz open",
    )  # fmt: skip


def _first_lines(stream: httpx.Response, n: int) -> list[str]:
    lines = []
    for line in stream.iter_lines():
        lines.append(line)
        if len(lines) >= n:
            break
    return lines


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard compares with ``hmac.compare_digest`` and checks every candidate it got, so
    the time taken depends neither on how much of the token matched nor on which one did."""
    from rankwatch.dashboard import auth

    calls: list[tuple[bytes, bytes]] = []
    compare_digest = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return compare_digest(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.token_matches(TOKEN, [TOKEN[:-1] + "x", TOKEN, "short"])
    assert [b for _, b in calls] == [(TOKEN[:-1] + "x").encode(), TOKEN.encode(), b"short"]
    assert all(a == TOKEN.encode() for a, _ in calls)
    assert not auth.token_matches(TOKEN, ["é" * 40, ""])


class _Agent:
    """A DEALER sending hand-made valid records (for names no launcher would produce)."""

    def __init__(self, addr: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(f"tcp://{addr}")

    def send(self, recs: list[records.Record]) -> None:
        self.sock.send(records.encode_frame(recs))

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def _step(run: str, rank: int, seq: int, **metrics: float) -> StepRecord:
    return StepRecord(
        run=run, rank=rank, seq=seq, time=time.time(), world_size=2, host="h", pid=1,
        step=seq, epoch=None, metrics=metrics or {"loss": 1.0 / seq},
    )  # fmt: skip


NASTY_RUNS = ("../../etc/x", "/etc/passwd", "<img src=x onerror=alert(1)>", 'q"\\\n}x{', "..")


def test_names_from_the_wire_never_become_paths(
    spawn: Spawner, tmp_path: Path, report: Any
) -> None:
    serve = spawn.serve()
    agent = _Agent(serve.addr)
    try:
        for run in NASTY_RUNS:
            agent.send([_step(run, 0, s, **{"a/../../b": 1.0, "<b>m</b>": 2.0}) for s in (1, 2)])
        wait_until(
            "the runs to be stored",
            lambda: {r["run"] for r in serve.get("/api/runs")["runs"]} >= set(NASTY_RUNS),
            30,
        )
    finally:
        agent.close()
    for run in NASTY_RUNS:
        if "\n" in run:
            continue  # the {run:path} route does not match a newline (404): listed, exported
        # Every byte escaped, dots too: a client must not resolve ".." in the path first.
        path = quote(run, safe="").replace(".", "%2E")
        url = f"{serve.url}/api/runs/{path}/series"

        def series(url: str = url) -> httpx.Response | None:
            res = httpx.get(url, params={"metric": "a/../../b"}, timeout=10)
            return res if res.status_code != 200 or res.json()["series"] else None

        res = wait_until(f"run {run!r} to be stored", series, 30)
        assert res.status_code == 200, (run, res.text)
        assert res.headers["content-type"].startswith("application/json")
        body = res.json()
        assert body["run"] == run and body["series"]["0"]["step"] == [1, 2]
    page = httpx.get(serve.url + "/", timeout=10).text
    assert "onerror" not in page
    # Prometheus labels stay well-formed whatever the names hold.
    text = httpx.get(serve.url + "/metrics", timeout=10).text
    names = {dict(labels).get("run") for labels in parse_prom(text)["rankwatch_run_last_step"]}
    assert len(names) == len(NASTY_RUNS)
    assert serve.stop() == 0
    # Export writes where it is told, naming the run only inside the file.
    for i, run in enumerate(NASTY_RUNS):
        out = tmp_path / f"export{i}.csv"
        done = subprocess.run(
            [*SERVE, "export", "--run", run, "--out", str(out), "--data", str(serve.data)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        with out.open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 2 * 2 and {row["run"] for row in rows} == {run}
    stray = [p for p in (tmp_path.parent / "etc", Path("/etc/x"), tmp_path / "x") if p.exists()]
    assert not stray
    files = sorted(p.name for p in serve.data.iterdir())
    assert all(name.startswith("store.duckdb") for name in files), files
    report(
        kind="access", what="run/metric names like ../../etc/x, /etc/passwd, HTML, quotes",
        result="stored, served as JSON, exported into the named file only; no path made",
    )  # fmt: skip


class _Hook(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        type(self).hits.append(self.path)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def failing_webhook() -> Iterator[str]:
    _Hook.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_tokens_and_webhook_secrets_never_reach_a_log(
    spawn: Spawner, tmp_path: Path, failing_webhook: str, report: Any
) -> None:
    url_secret, sign_secret = "URLSECRET4c1e9a", "SIGNSECRET7b2d0f"
    config = tmp_path / "serve.toml"
    config.write_text(
        '[serve]\nlost_after_s = 2.0\n\n[[webhooks]]\nkind = "dingtalk"\n'
        f'url = "http://{failing_webhook}/robot/send?access_token={url_secret}"\n'
        f'secret = "{sign_secret}"\nattempts = 2\nbackoff_s = 0.2\n'
    )
    serve = spawn.serve(extra=["--token", TOKEN, "--config", str(config)], verbose=2)
    serve.token = TOKEN
    agent = _Agent(serve.addr)
    try:
        agent.send([_step("secrets", 0, 1), _step("secrets", 1, 1, loss=1.0)])
        crash = EventRecord(
            run="secrets", rank=1, seq=2, time=time.time(), world_size=2, host="h", pid=1,
            event="crash", step=1, info={"exc_type": "RuntimeError", "message": "boom"},
        )  # fmt: skip
        agent.send([crash])
    finally:
        agent.close()
    wait_until("the webhook to be called and fail", lambda: len(_Hook.hits) >= 2, 30)
    wait_until("the failure to be logged", lambda: "webhook" in serve.output().lower(), 15)
    # Requests with the token in every place it can be, right and wrong.
    for params in ({"token": TOKEN}, {"token": TOKEN + "x"}):
        httpx.get(serve.url + "/api/status", params=params, timeout=10)
    httpx.get(serve.url + "/api/status", headers={"Authorization": f"Bearer {TOKEN}"})
    assert serve.stop() == 0
    log = serve.output()
    assert all(secret not in log for secret in (TOKEN, url_secret, sign_secret)), log[-3000:]
    assert any(url_secret in hit for hit in _Hook.hits)  # the secret was in use all along
    report(
        kind="access", what="--token and a DingTalk webhook (URL token + signing secret) "
        "failing with HTTP 500", result="neither the token nor the secrets appear in the log",
        log_lines=len(log.splitlines()),
    )  # fmt: skip


def test_the_token_from_a_file_stays_out_of_ps(spawn: Spawner, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    serve = spawn.serve(extra=["--token-file", str(token_file)])
    serve.token = TOKEN
    assert serve.proc is not None
    cmdline = Path(f"/proc/{serve.proc.pid}/cmdline").read_bytes()
    assert TOKEN.encode() not in cmdline
    assert httpx.get(serve.url + "/api/status", timeout=10).status_code == 401
    assert httpx.get(serve.url + "/api/status", headers=serve.headers()).status_code == 200
    assert "not the ZeroMQ ingest port: use --curve" in serve.output()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = subprocess.run(
        [*SERVE, "serve", "--data", str(tmp_path / "d2"), "--token-file", str(empty)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--token-file: the token file {empty} is empty" in done.stderr


def test_the_served_app_checks_host_origin_and_content_type(spawn: Spawner) -> None:
    serve = spawn.serve(extra=["--allow-host", "rw.example.org"])
    url = serve.url + "/api/runs"
    assert httpx.get(url, headers={"Host": "rw.example.org"}, timeout=10).status_code == 200
    rebound = httpx.get(url, headers={"Host": "rebind.attacker.example"}, timeout=10)
    assert rebound.status_code == 403
    assert "--allow-host rebind.attacker.example" in rebound.json()["detail"]
    cross = httpx.post(
        serve.url + "/api/ingest",
        content='{"records": []}',
        headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
        timeout=10,
    )
    assert cross.status_code == 403 and "cross-site request refused" in cross.json()["detail"]
    plain = httpx.post(
        serve.url + "/api/ingest",
        content='{"records": []}',
        headers={"Content-Type": "text/plain"},
        timeout=10,
    )
    assert plain.status_code == 415
    prom = parse_prom(httpx.get(serve.url + "/metrics", timeout=10).text)
    refused = {dict(labels)["kind"]: n for labels, n in prom[PREFIX + "http_refused"].items()}
    assert refused == {"host": 1, "origin": 1, "content_type": 1, "ingest_off": 0}


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")
def test_with_curve_http_ingest_needs_a_token(spawn: Spawner, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    made = subprocess.run([*SERVE, "keys", "--dir", str(keys)], capture_output=True, timeout=60)
    assert made.returncode == 0
    serve = spawn.serve(extra=["--curve", str(keys)])
    res = httpx.post(serve.url + "/api/ingest", json={"records": []}, timeout=10)
    assert res.status_code == 403
    assert res.json()["detail"].startswith(
        "HTTP ingest is off: this server takes records only over its CurveZMQ port"
    )
    assert "HTTP ingest (POST /api/ingest) is off: no token is set" in serve.output()
    guarded = spawn.serve(
        tmp_path / "data2", extra=["--curve", str(keys)], env={"RANKWATCH_TOKEN": TOKEN}
    )
    guarded.token = TOKEN
    res = httpx.post(
        guarded.url + "/api/ingest", json={"records": []}, headers=guarded.headers(), timeout=10
    )
    assert res.status_code == 200
