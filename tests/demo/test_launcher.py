"""The demo's settings checks, its MindSpore-missing path, and leaving no process behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rankwatch.demo import launcher
from rankwatch.demo.launcher import DemoConfig, msrun_command, run_demo
from rankwatch.demo.processes import Processes, tokened_pids


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"fault": "melt"}, "--fault must be one of"),
        ({"ranks": 0}, "--ranks must be >= 1"),
        ({"fault_rank": 4}, "--fault-rank 4 is not a rank of 0..3"),
        ({"fault_rank": -1}, "--fault-rank -1"),
        ({"steps": 0}, "--steps and --fault-step must be >= 1"),
        ({"step_sleep": -1.0}, "--step-sleep must be >= 0"),
        ({"port": 70000}, "--port 70000 is not a TCP port"),
        ({"ingest_port": 8670}, "--port and --ingest-port must differ"),
        ({"min_stall_s": 0.0}, "--min-stall must be > 0 seconds"),
        ({"min_stall_s": float("nan")}, "--min-stall must be > 0 seconds"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(changes: dict[str, object], message: str) -> None:
    cfg = DemoConfig(**changes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        cfg.check()


def test_no_fault_needs_no_fault_rank() -> None:
    DemoConfig(fault="none", ranks=1, fault_rank=7).check()


def test_without_mindspore_it_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(launcher, "mindspore_available", lambda: False)
    assert run_demo(DemoConfig(data=tmp_path)) == 2
    err = capsys.readouterr().err
    assert "pip install 'rankwatch[mindspore]'" in err
    assert "rankwatch demo --simulate" in err
    assert not any(tmp_path.iterdir()), "nothing may start before the check"


def test_serve_command_carries_the_health_limits(tmp_path: Path) -> None:
    cmd = launcher.serve_command(DemoConfig(lost_after_s=5, min_stall_s=2.5), tmp_path)
    assert cmd[cmd.index("--min-stall-s") + 1] == "2.5"
    config = Path(cmd[cmd.index("--config") + 1])
    assert config.read_text(encoding="utf-8") == "[serve]\nlost_after_s = 5.0\n"
    assert "--min-stall-s" not in launcher.serve_command(DemoConfig(), tmp_path)


def test_msrun_command_carries_the_fault(tmp_path: Path) -> None:
    cfg = DemoConfig(fault="hang", fault_rank=1, fault_step=7, ranks=2, steps=50)
    cmd = msrun_command(cfg, tmp_path, 12345)
    assert "--worker_num=2" in cmd and "--local_worker_num=2" in cmd
    assert "--master_port=12345" in cmd and "--join=True" in cmd
    script = Path(next(arg for arg in cmd if arg.endswith(".py")))
    assert script.name == "train_mindspore.py" and script.exists()
    tail = cmd[cmd.index(str(script)) + 1 :]
    assert tail[tail.index("--fault") + 1] == "hang"
    assert tail[tail.index("--fault-rank") + 1] == "1"
    assert tail[tail.index("--fault-step") + 1] == "7"


def test_stop_all_leaves_nothing_behind(tmp_path: Path) -> None:
    procs = Processes()
    # A child that ignores SIGINT, and a grandchild that leaves the group with setsid (as msrun's
    # workers do): the group kill cannot reach it, the token sweep must.
    script = "trap '' INT; setsid sleep 300 & sleep 300"
    leader = procs.spawn("tree", ["sh", "-c", script], log_path=tmp_path / "tree.log")
    deadline = time.monotonic() + 10
    while len(tokened_pids(procs.token)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = tokened_pids(procs.token)
    assert len(tree) == 3, tree
    started = time.monotonic()
    procs.stop_all(grace_s=0.5)
    assert time.monotonic() - started < 15
    assert tokened_pids(procs.token) == []
    assert leader.poll() is not None
    for pid in tree:
        assert not _alive(pid), pid


def test_tokened_pids_sees_only_its_own_token() -> None:
    procs = Processes()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert tokened_pids(procs.token) == []
        mine = procs.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"])
        deadline = time.monotonic() + 10
        while mine.pid not in tokened_pids(procs.token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tokened_pids(procs.token) == [mine.pid]
    finally:
        procs.stop_all(grace_s=1.0)
        other.send_signal(signal.SIGKILL)
        other.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_busy_port_is_named_and_nothing_is_left_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = run_demo(DemoConfig(simulate=True, port=port, data=tmp_path / "demo"))
    out = capsys.readouterr().out
    assert code == 2
    assert f"port {port} on 127.0.0.1 is in use: pick another with --port" in out
    assert "stopped everything it started" in out
