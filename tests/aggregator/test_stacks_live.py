"""Where stalled ranks are, end to end with real parts: two real Monitors in their own
processes stop stepping, one waiting inside a framework module (a stand-in ``mindspore/`` file
under a temp path), one sleeping in user code. Their stall samples ride the heartbeats over
ZeroMQ to a real aggregator on 127.0.0.1; ``GET /api/run/stacks`` (real uvicorn) groups them and
names the odd one out, `rankwatch stacks` prints it, and the incident's hang rule names the
user-code rank as culprit. Then heartbeats with huge or malformed stacks: cut or refused,
counted, and the heartbeat kept."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import zmq
from rankwatch.agent.wire.records import SCHEMA_VERSION
from rankwatch.aggregator.provider import AggregatorProvider
from rankwatch.aggregator.service import Aggregator, ServeConfig
from rankwatch.dashboard.app import create_app

from tests import polling
from tests.dashboard.test_live import serve

RUN = "hangjob"
RANKWATCH = str(Path(sys.executable).parent / "rankwatch")
HOLD_S = 8.0  # how long each rank stays stuck (the test ends them sooner once it has seen all)

FRAMEWORK = """
import threading

def AllReduce(release):
    release.wait(HOLD_S)  # a collective waiting for its peer
"""

RANK = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[3])
from mindspore.nn.wrap import grad_reducer
from rankwatch.agent.monitor import Monitor

rank = int(sys.argv[1])
mon = Monitor(run="hangjob", rank=rank, world_size=2, addr=sys.argv[2], log_dir=sys.argv[4],
              heartbeat_s=0.2, stall_min_s=0.5, stall_interval_s=0.4, stack_dump_s=0)
for step in range(1, 21):
    mon.log(step, loss=1.0 / step)
    time.sleep(0.02)

def on_train_step_begin(release):
    deadline = time.monotonic() + HOLD_S
    while not release.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)  # the user's callback, stuck

release = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), release.set()), daemon=True).start()
if rank == 0:
    grad_reducer.AllReduce(release)
else:
    on_train_step_begin(release)
mon.close()
"""


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _rank(tmp_path: Path, rank: int, addr: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "rank.py"), str(rank), addr, str(tmp_path / "fw"),
         str(tmp_path / "logs")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_stalled_ranks_stacks_name_the_one_in_user_code(tmp_path: Path) -> None:
    fw = tmp_path / "fw" / "mindspore" / "nn" / "wrap"
    fw.mkdir(parents=True)
    for folder in (fw, fw.parent, fw.parent.parent):
        (folder / "__init__.py").write_text("")
    hold = f"HOLD_S = {HOLD_S}\n"
    (fw / "grad_reducer.py").write_text(hold + textwrap.dedent(FRAMEWORK))
    (tmp_path / "rank.py").write_text(hold + textwrap.dedent(RANK))
    cfg = ServeConfig(
        data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
        console_alerts=False, min_stall_s=1.0, store_flush_s=0.2,
    )  # fmt: skip
    agg = Aggregator(cfg)
    agg.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        addr = f"tcp://127.0.0.1:{agg.ingest_port}"
        procs = [_rank(tmp_path, rank, addr) for rank in (0, 1)]
        with serve(create_app(AggregatorProvider(agg))) as url:
            stacks_url = f"{url}/api/run/stacks?run={RUN}"

            def both_sampled() -> Any:
                try:
                    view = _get(stacks_url)
                except urllib.error.HTTPError as exc:  # 404 until the run's first record
                    assert exc.code == 404, exc
                    return None
                return view if len(view["samples"]) == 2 else None

            view = polling.wait_until(
                both_sampled, 6.0, 0.1, "a stack sample of both ranks",
                lambda: agg.counters().get("stacks_received"),
            )  # fmt: skip
            by_rank = {s["rank"]: s for s in view["samples"]}
            assert by_rank[0]["where"] == "framework"
            files = [(f[0], f[2]) for f in by_rank[0]["frames"]]
            assert ("mindspore/nn/wrap/grad_reducer.py", "AllReduce") in files
            assert by_rank[1]["where"] == "sleep"
            assert by_rank[1]["frames"][0][2] == "on_train_step_begin"
            assert all(s["step"] == 20 and s["stalled_s"] >= 0.5 for s in by_rank.values())
            assert view["odd_ones_out"] == [1]
            assert "rank 0 in mindspore/.../grad_reducer.py AllReduce" in view["summary"]
            assert "rank 1 in tmp" not in view["summary"]  # file names are shortened
            assert "on_train_step_begin" in view["summary"]

            printed = subprocess.run(
                [RANKWATCH, "stacks", "--run", RUN, "--url", url],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert printed.returncode == 0, printed.stderr
            lines = printed.stdout.splitlines()
            assert lines[0] == f"run {RUN}: 2 ranks sampled, 2 distinct stacks"
            odd = [line for line in lines if "<- not where the others are" in line]
            assert len(odd) == 1 and odd[0].startswith("rank 1 in ") and "[sleep]" in odd[0]
            assert any("grad_reducer.py" in line and "AllReduce" in line for line in lines)

            def hang_incident() -> Any:
                for inc in agg.incidents.incidents(RUN):
                    if inc.cause == "hang" and inc.basis.startswith("stacks"):
                        return inc
                return None

            inc = polling.wait_until(
                hang_incident, 6.0, 0.1, "a hang incident judged by stacks",
                lambda: [i.as_dict() for i in agg.incidents.incidents(RUN)],
            )  # fmt: skip
            assert inc.culprits == (1,)
            assert "on_train_step_begin" in inc.summary
            api = _get(f"{url}/api/run/incidents?run={RUN}")["incidents"]
            assert any(i["cause"] == "hang" and i["culprits"] == [1] for i in api)
        for p in procs:
            p.communicate("", timeout=30)
        # the samples outlive the live state: the store holds each rank's latest
        polling.wait_until(lambda: len(agg.store.stacks(RUN)) == 2, 5.0, 0.1, "stored samples")
        assert agg.store.stacks(RUN)[1]["where"] == "sleep"
        assert agg.counters()["stacks_refused"] == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
        agg.stop()
    # the JSONL holds the samples too, like every heartbeat
    lines = (tmp_path / "logs" / RUN / "rank1.jsonl").read_text().splitlines()
    stacks = [json.loads(line)["stack"] for line in lines if '"stack"' in line]
    assert stacks and stacks[-1]["where"] == "sleep"
    assert all(s["step"] == 20 for s in stacks)  # sampled only once the steps stopped


def _beat(seq: int, stack: Any) -> dict[str, Any]:
    return {"kind": "heartbeat", "run": "flood", "rank": 0, "seq": seq, "time": time.time(),
            "last_step": 3, "next_in": 5.0, "dropped": 0, "stack": stack}  # fmt: skip


def test_huge_or_malformed_stacks_are_cut_or_refused_and_counted(tmp_path: Path) -> None:
    cfg = ServeConfig(data_dir=tmp_path / "data", ingest_host="127.0.0.1", ingest_port=0,
                      console_alerts=False)  # fmt: skip
    with Aggregator(cfg) as agg:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.connect(f"tcp://127.0.0.1:{agg.ingest_port}")
            huge = {
                "where": "user", "time": time.time(), "signature": "s" * 10_000,
                "note": "\x1b[31m" * 1000,
                "frames": [["/very/" * 200 + "long.py", 7, "f" * 500]] * 1000,  # 1.7 MB
            }  # fmt: skip
            bad = [
                [1, 2, 3],
                {"where": "user", "time": 1.0, "frames": "not a list"},
                {"where": "elsewhere", "time": 1.0, "frames": []},
                {"where": "user", "time": float("nan"), "frames": []},
                {"where": "user", "time": 1.0, "frames": [["a.py", "7", "f"]]},
            ]
            beats = [_beat(1, huge), *(_beat(2 + i, s) for i, s in enumerate(bad))]
            for beat in beats:
                frame = msgpack.packb({"v": SCHEMA_VERSION, "records": [beat]})
                sock.send(frame)
            polling.wait_until(
                lambda: agg.n["accepted"] == len(beats), 5.0, 0.05, "every heartbeat accepted",
                lambda: (agg.n, agg.counters()["ingest_errors"]),
            )  # fmt: skip
            agg.tick()
            counters = agg.counters()
            assert counters["stacks_truncated"] == 1
            assert counters["stacks_refused"] == len(bad)
            assert counters["stacks_received"] == 1
            view = AggregatorProvider(agg).read_stacks("flood")
            (sample,) = view["samples"]
            assert len(sample["frames"]) == 16
            assert all(len(f[0]) <= 96 and len(f[2]) <= 64 for f in sample["frames"])
            assert len(sample["signature"]) <= 32 and "\x1b" not in sample["note"]
            assert "\x1b" not in view["text"] and len(view["text"]) < 4000
        finally:
            sock.close(linger=0)
            ctx.term()
