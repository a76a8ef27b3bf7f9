"""Multi-host for real: the aggregator on one network namespace, ranks on two others.

Topology (all inside namespaces this test makes, addresses private to them)::

    node1 (ranks 0, 1) 10.231.1.2 --veth-- 10.231.1.1 \\
                                                       agg: serve, ingest on 10.231.0.1:8671
    node2 (ranks 2, 3) 10.231.2.2 --veth-- 10.231.2.1 /

A second test puts a `rankwatch relay` on node2 (a per-node relay, as for very large jobs).

The ranks are simulated (``rankwatch.demo.simulate``: real Monitor processes) and are told
nothing about rankwatch: like torchrun workers they see ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` (the aggregator's host, not localhost) and ``TORCHELASTIC_RUN_ID``; the address
(``MASTER_ADDR`` at the default ingest port) and the run name are derived from those alone. Each
"host" also has its own hostname (a UTS namespace) and its own log directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent import DEFAULT_INGEST_PORT
from rankwatch.demo.launcher import rankwatch_command

from .conftest import (
    Serve,
    assert_store_matches_jsonl,
    events_by_rank,
    launch_env,
    read_jsonl,
    stop_process,
)

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]

AGG_IP = "10.231.0.1"
NODES = {"node1": (1, [0, 1]), "node2": (2, [2, 3])}  # name -> (subnet index, ranks)
WORLD = 4
STEPS = 40
FAULT_RANK, FAULT_STEP = 2, 15
READY_TIMEOUT_S = 90.0


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def hosts() -> Iterator[dict[str, str]]:
    """Three network namespaces wired as above; deleted (with their veths) afterwards."""
    if sys.platform != "linux":
        pytest.skip("network namespaces are Linux only")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    tag = f"rw{os.getpid() % 100000}"
    names = {"agg": f"{tag}-agg", **{node: f"{tag}-{node}" for node in NODES}}
    made: list[str] = []
    try:
        for ns in names.values():
            done = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {done.stderr.strip()}")
            made.append(ns)
        agg = names["agg"]
        _ip("-n", agg, "link", "set", "lo", "up")
        _ip("-n", agg, "addr", "add", f"{AGG_IP}/32", "dev", "lo")
        for node, (i, _) in NODES.items():
            ns, near, far = names[node], f"{tag}a{i}", f"{tag}n{i}"  # names <= 15 chars
            _ip("link", "add", near, "netns", agg, "type", "veth", "peer", "name", far,
                "netns", ns)  # fmt: skip
            _ip("-n", agg, "addr", "add", f"10.231.{i}.1/30", "dev", near)
            _ip("-n", ns, "addr", "add", f"10.231.{i}.2/30", "dev", far)
            for where, dev in ((agg, near), (ns, far), (ns, "lo")):
                _ip("-n", where, "link", "set", dev, "up")
            _ip("-n", ns, "route", "add", f"{AGG_IP}/32", "via", f"10.231.{i}.1")
        yield names
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_host(hosts: dict[str, str], node: str, cmd: list[str]) -> list[str]:
    """``cmd`` on "host" ``node``: its network namespace and a UTS namespace with its name."""
    return ["ip", "netns", "exec", hosts[node], "unshare", "--uts", "sh", "-c",
            f'hostname {node} && exec "$@"', "sh", *cmd]  # fmt: skip


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def run_job(
    hosts: dict[str, str], serve: Serve, tmp_path: Path, relay_nodes: frozenset[str] = frozenset()
) -> tuple[str, dict[int, Any]]:
    """Four simulated ranks on two hosts, launched like torchrun workers; returns (run, jsonl).

    On a node in ``relay_nodes`` a `rankwatch relay` forwards the node's ranks (which then send
    to it on 127.0.0.1, as the relay's users are told to); the relay finds the aggregator
    through MASTER_ADDR itself.
    """
    serve.wait_for("serve in its namespace", lambda: serve.get("/api/status"), READY_TIMEOUT_S)
    launch_id = f"netns-{os.getpid()}-{len(relay_nodes)}"
    head = {"MASTER_ADDR": AGG_IP, "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": launch_id}
    relays: list[subprocess.Popen[bytes]] = []
    ranks: list[subprocess.Popen[bytes]] = []
    try:
        for node in sorted(relay_nodes):
            relay = [*rankwatch_command(), "relay", "--listen", "tcp://127.0.0.1:8671"]
            relays.append(start(in_host(hosts, node, relay), launch_env(**head),
                                tmp_path / f"relay-{node}.log"))  # fmt: skip
        for node, (_, node_ranks) in NODES.items():
            for local, rank in enumerate(node_ranks):
                env = launch_env(
                    RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(local),
                    RANKWATCH_LOG_DIR=str(tmp_path / node), **head,
                )  # fmt: skip
                if node in relay_nodes:
                    env["RANKWATCH_ADDR"] = "127.0.0.1:8671"
                sim = [
                    sys.executable, "-m", "rankwatch.demo.simulate", "--steps", str(STEPS),
                    "--fault", "labels", "--fault-rank", str(FAULT_RANK),
                    "--fault-step", str(FAULT_STEP), "--step-sleep", "0.05",
                ]  # fmt: skip
                ranks.append(start(in_host(hosts, node, sim), env, tmp_path / f"rank{rank}.log"))
        codes = [proc.wait(timeout=180) for proc in ranks]
    finally:
        for proc in ranks:
            stop_process(proc)
        for proc in relays:
            stop_process(proc, signal.SIGINT)  # the relay flushes to the head before it exits
    logs = {p.name: p.read_text(errors="replace")[-800:] for p in tmp_path.glob("r*.log")}
    assert codes == [0] * WORLD, logs

    def one_finished_run() -> dict[str, Any] | None:
        runs = (serve.get("/api/status") or {}).get("runs") or []
        if len(runs) != 1 or len(runs[0].get("ranks") or []) != WORLD:
            return None
        done = all(row.get("state") == "finished" for row in runs[0]["ranks"])
        return runs[0] if done else None

    entry = serve.wait_for("one run with 4 finished ranks", one_finished_run, 30.0)
    run = entry["run"]
    assert run.startswith("simulate-"), run  # derived from the script and the launch id
    hosts_seen = {row["rank"]: row.get("host") for row in entry["ranks"]}
    assert hosts_seen == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    flagged = {d["rank"] for d in entry.get("divergences") or []}
    assert flagged == {FAULT_RANK}, entry.get("divergences")

    jsonl: dict[int, Any] = {}
    for node in NODES:
        jsonl.update(read_jsonl(tmp_path / node / run))
    assert sorted(jsonl) == list(range(WORLD))
    for rank, starts in events_by_rank(jsonl, "start").items():
        info = starts[0].info
        relayed = any(rank in NODES[node][1] for node in relay_nodes)
        want = "tcp://127.0.0.1:8671" if relayed else f"tcp://{AGG_IP}:{DEFAULT_INGEST_PORT}"
        assert info.get("addr") == want, info
        assert info.get("launcher") == "torchrun"
    return run, jsonl


def test_ranks_on_two_hosts_reach_the_aggregator_by_master_addr(
    hosts: dict[str, str], serve_factory: Any, tmp_path: Path
) -> None:
    serve: Serve = serve_factory(
        netns=hosts["agg"], ingest_host="*", ingest_port=DEFAULT_INGEST_PORT, port=8670, wait=False
    )
    run, jsonl = run_job(hosts, serve, tmp_path)
    serve.stop()
    assert_store_matches_jsonl(serve.data, run, jsonl)


def test_a_per_node_relay_forwards_one_hosts_ranks(
    hosts: dict[str, str], serve_factory: Any, tmp_path: Path
) -> None:
    serve: Serve = serve_factory(
        netns=hosts["agg"], ingest_host="*", ingest_port=DEFAULT_INGEST_PORT, port=8670, wait=False
    )
    run, jsonl = run_job(hosts, serve, tmp_path, relay_nodes=frozenset({"node2"}))
    serve.stop()
    assert_store_matches_jsonl(serve.data, run, jsonl)
