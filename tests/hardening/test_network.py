"""One rank cut off by the network, then back: it reconnects by itself and what was lost on
the wire is resent, so the store equals the ranks' JSONL files.

The rank runs in a network namespace this test makes, joined to the aggregator's by a veth
pair with private addresses; taking the rank's end of the link down cuts it off, and the other
rank (same host as the aggregator) is not affected. Needs root; skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Spawner, need_root
from .procs import compare, read_jsonl, read_store, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.timeout(150)]

RUN = "netcut"
CUT_S = 9.0  # longer than the agent's ZMTP heartbeat timeout (6 s): the link is declared dead


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def link() -> Iterator[dict[str, str]]:
    """A namespace ``ns`` whose ``dev`` (10.232.N.2) reaches ``head`` (10.232.N.1) here."""
    need_root("network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    tag = f"rwh{os.getpid() % 100000}"
    net = 20 + os.getpid() % 200  # a private /30 of its own, so parallel runs do not clash
    ns, near, far = f"{tag}ns", f"{tag}h", f"{tag}n"
    head, addr = f"10.232.{net}.1", f"10.232.{net}.2"
    done = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {done.stderr.strip()}")
    try:
        _ip("link", "add", near, "type", "veth", "peer", "name", far, "netns", ns)
        _ip("addr", "add", f"{head}/30", "dev", near)
        _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", far)
        _ip("link", "set", near, "up")
        _ip("-n", ns, "link", "set", far, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield {"ns": ns, "dev": far, "head": head}
    finally:
        subprocess.run(["ip", "link", "del", near], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _rank_row(serve: Any, rank: int) -> dict[str, Any]:
    entry = serve.run_entry(RUN) or {}
    return next((r for r in entry.get("ranks") or [] if r["rank"] == rank), {})


def test_a_rank_cut_off_by_the_network_reconnects_and_backfills(
    spawn: Spawner, tmp_path: Path, link: dict[str, str], report: Any
) -> None:
    serve = spawn.serve(ingest_host=link["head"])
    stop = tmp_path / "stop"
    logs = tmp_path / "logs"
    near = spawn.rank(RUN, 0, 2, serve.addr, logs, stop_file=stop)
    far = spawn.rank(RUN, 1, 2, serve.addr, logs, stop_file=stop,
                     prefix=["ip", "netns", "exec", link["ns"]])  # fmt: skip
    wait_until(
        "both ranks alive",
        lambda: serve.rank_states(RUN) == {0: "alive", 1: "alive"},
        60,
        detail=lambda: f"{serve.rank_states(RUN)}\n{far.output()[-1000:]}",
    )
    _ip("-n", link["ns"], "link", "set", link["dev"], "down")
    try:
        cut_step = _rank_row(serve, 1).get("last_step") or 0
        time.sleep(CUT_S)
        during = _rank_row(serve, 1).get("last_step") or 0
        near_state = serve.rank_states(RUN)[0]
    finally:
        _ip("-n", link["ns"], "link", "set", link["dev"], "up")
    back = time.monotonic()
    assert during - cut_step < 20, "records still arrived over a link that was down"
    assert near_state == "alive", "the rank on the aggregator's host was affected"
    wait_until(
        "the cut-off rank to reconnect",
        lambda: (_rank_row(serve, 1).get("last_step") or 0) > during + 50,
        30,
    )
    reconnect_s = time.monotonic() - back
    gaps = sum(hi - lo + 1 for lo, hi in _rank_row(serve, 1).get("gaps") or [])
    wait_until("the gaps to be backfilled", lambda: not _rank_row(serve, 1).get("gaps"), 30)
    backfill_s = time.monotonic() - back
    stop.touch()
    assert [near.wait(30), far.wait(30)] == [0, 0]
    wait_until(
        "both ranks finished",
        lambda: serve.rank_states(RUN) == {0: "finished", 1: "finished"},
        30,
    )
    assert serve.stop() == 0
    result = compare(read_store(serve.data, RUN), read_jsonl(logs / RUN))
    report(
        kind="fault", what=f"one rank's network link down {CUT_S:g} s, then up (netns + veth)",
        result=f"reconnected {reconnect_s:.1f} s after the link came back, backfilled in "
        f"{backfill_s:.1f} s", missing_at_reconnect=gaps, **result,
    )  # fmt: skip
    assert result == {**result, "missing": 0, "extra": 0, "differ": 0}
