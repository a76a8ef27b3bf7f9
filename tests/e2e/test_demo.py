"""`rankwatch demo` run as a user would: unattended (--exit-when-done) and stopped with Ctrl-C.

Every check ends by looking through /proc for any process that still mentions the test's data
directory (serve's --data, the ranks' RANKWATCH_LOG_DIR): the demo must leave none behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from rankwatch.demo.launcher import SUMMARY_SAID, rankwatch_command

from .conftest import free_port, get_json, launch_env, require_msrun

FAULT_RANK = 2
FAULT_STEP = 20
WITHIN_STEPS = 5
FIT_METRICS = ("loss", "grad_norm", "grad_norm_local")  # timing metrics are noisy on a busy box
HANG_STALL_S = 5.0  # serve's stall limit for the hang (default 30 s); the healthy ranks finish


def demo_command(data: Path, *args: str) -> tuple[list[str], int]:
    port = free_port()
    cmd = [*rankwatch_command(), "demo", "--port", str(port), "--ingest-port", str(free_port())]
    return [*cmd, "--data", str(data), *args], port


def run_demo(data: Path, *args: str, timeout_s: float) -> tuple[int, str]:
    cmd, _ = demo_command(data, *args)
    proc = subprocess.Popen(
        cmd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"demo still running after {timeout_s:g} s:\n{out[-4000:]}")
    return proc.returncode, out


def summary_of(out: str) -> dict[str, Any]:
    said = f"  {SUMMARY_SAID} "
    lines = [line for line in out.splitlines() if line.startswith(said)]
    assert lines, f"no summary printed:\n{out[-4000:]}"
    return json.loads(Path(lines[-1].removeprefix(said)).read_text())


def leftovers(marker: str) -> list[str]:
    """Live processes whose command line or environment contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if marker.encode() in blob and state != "Z":
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:200]!r}")
    return found


@pytest.fixture(autouse=True)
def _reap(tmp_path: Path) -> Any:
    """After each test (its own checks for leftovers have run by then), kill whatever still
    mentions its folder: a demo that timed out leaves ranks and serve in sessions of their own,
    which would load the machine for every later test."""
    yield
    for line in leftovers(str(tmp_path)):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)


def assert_nothing_left(data: Path) -> None:
    deadline = time.monotonic() + 10
    while (left := leftovers(str(data))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def assert_flagged_only_the_bad_rank(summary: dict[str, Any]) -> None:
    fit = [f for f in summary["flags"] if f["metric"] in FIT_METRICS]
    assert {f["rank"] for f in fit} == {FAULT_RANK}, summary["flags"]
    first = min(f["step"] or f["since_step"] for f in fit)
    assert FAULT_STEP <= first <= FAULT_STEP + WITHIN_STEPS, summary["flags"]


@pytest.mark.timeout(180)
def test_simulated_demo_runs_unattended(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    code, out = run_demo(
        data, "--simulate", "--exit-when-done", "--steps", "40", "--step-sleep", "0.05",
        timeout_s=150,
    )  # fmt: skip
    assert code == 0, out[-4000:]
    assert "dashboard:  http://127.0.0.1:" in out and "look for:" in out
    assert "summary-json" not in out and "summary of run demo-" in out
    summary = summary_of(out)
    assert summary["ranks"] == {str(r): "finished" for r in range(4)}
    assert_flagged_only_the_bad_rank(summary)
    run_dir = data / "jobs" / summary["run"]
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert sorted(p.name for p in (data / "logs" / summary["run"]).iterdir()) == [
        f"rank{r}.jsonl" for r in range(4)
    ]
    assert "stopped everything it started" in out
    assert_nothing_left(data)


@pytest.mark.timeout(180)
def test_simulated_hang_exits_once_the_rank_is_stalled(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    code, out = run_demo(
        data, "--simulate", "--fault", "hang", "--exit-when-done", "--steps", "40",
        "--step-sleep", "0.05", "--min-stall", str(HANG_STALL_S), timeout_s=150,
    )  # fmt: skip
    assert code == 0, out[-4000:]
    summary = summary_of(out)
    assert summary["ranks"][str(FAULT_RANK)] == "stalled", summary
    assert all(summary["ranks"][str(r)] == "finished" for r in range(4) if r != FAULT_RANK)
    assert_nothing_left(data)  # the hung rank sleeps forever: the demo must have killed it


@pytest.mark.timeout(120)
def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    cmd, port = demo_command(data, "--simulate", "--steps", "100000", "--step-sleep", "0.05")
    proc = subprocess.Popen(
        cmd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = (get_json(f"http://127.0.0.1:{port}/api/status") or {}).get("runs") or []
            if runs and (runs[0].get("last_step") or 0) >= 5:
                break
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            time.sleep(0.3)
        else:
            pytest.fail("the simulated ranks never reached step 5")
        assert len(leftovers(str(data))) >= 5  # serve and four ranks
        os.kill(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends to the demo
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert "stopping..." in out and "stopped everything it started" in out
    assert_nothing_left(data)


@pytest.mark.msrun
@pytest.mark.mindspore
@pytest.mark.timeout(420)
def test_real_demo_runs_unattended(tmp_path: Path) -> None:
    require_msrun()
    data = tmp_path / "demo"
    code, out = run_demo(
        data, "--exit-when-done", "--steps", "40", "--step-sleep", "0.05", timeout_s=360
    )
    assert code == 0, out[-4000:]
    assert "MindSpore msrun job" in out
    summary = summary_of(out)
    assert summary["ranks"] == {str(r): "finished" for r in range(4)}
    assert_flagged_only_the_bad_rank(summary)
    assert_nothing_left(data)


@pytest.mark.msrun
@pytest.mark.mindspore
@pytest.mark.timeout(300)
def test_ctrl_c_stops_a_real_msrun_job(tmp_path: Path) -> None:
    require_msrun()
    data = tmp_path / "demo"
    cmd, port = demo_command(data, "--steps", "2000", "--step-sleep", "0.1")
    proc = subprocess.Popen(
        cmd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            runs = (get_json(f"http://127.0.0.1:{port}/api/status") or {}).get("runs") or []
            if (
                runs
                and len(runs[0].get("ranks") or []) == 4
                and (runs[0].get("last_step") or 0) >= 3
            ):
                break
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            time.sleep(0.5)
        else:
            pytest.fail("the msrun job never reached step 3")
        workers = [p for p in leftovers(str(data)) if b"train_mindspore" in p.encode()]
        assert len(workers) >= 4, workers  # four workers (+ the scheduler) are running
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert_nothing_left(data)
