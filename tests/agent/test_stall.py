"""The Monitor's stack watchdog and stall sampling (agent/stall.py), with a real Monitor and a
real faulthandler timer: pushed back while steps come, writing once they stop, off at close."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rankwatch.agent import stall
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.stacks import parse_faulthandler, stacks_path

from tests import polling
from tests.cli.running import free_port


def _monitor(tmp_path: Path, **kw: object) -> Monitor:
    addr = f"tcp://127.0.0.1:{free_port()}"  # nobody listens: the sender thread runs anyway
    return Monitor(run="w", rank=0, world_size=1, addr=addr, log_dir=tmp_path, heartbeat_s=0.1,
                   **kw)  # type: ignore[arg-type]  # fmt: skip


def test_watchdog_waits_while_steps_come_and_writes_when_they_stop(tmp_path: Path) -> None:
    mon = _monitor(tmp_path, stack_dump_s=0.6)
    path = stacks_path(mon.jsonl_path)
    try:
        end = time.monotonic() + 1.5
        step = 0
        while time.monotonic() < end:
            step += 1
            mon.log(step, loss=1.0)
            time.sleep(0.05)
        assert path.read_text() == ""  # 1.5 s of steps, a 0.6 s timeout: pushed back each beat
        polling.wait_until(lambda: path.read_text(), 3.0, 0.05, "a dump once steps stop")
        dumps = parse_faulthandler(path.read_text())
        assert any("test_watchdog_waits" in f.function for t in dumps for f in t.frames)
    finally:
        mon.close()
    size = path.stat().st_size
    time.sleep(1.0)
    assert path.stat().st_size == size  # disarmed at close


def test_stack_dump_s_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(stall.STACK_DUMP_ENV, "0")
    mon = _monitor(tmp_path)
    try:
        assert mon._stall is not None and mon._stall.watchdog is None
        assert not stacks_path(mon.jsonl_path).exists()
    finally:
        mon.close()
    monkeypatch.setenv(stall.STACK_DUMP_ENV, "soon")
    with pytest.raises(ValueError, match="RANKWATCH_STACK_DUMP_S"):
        _monitor(tmp_path)
    with pytest.raises(ValueError, match=">= 0"):
        _monitor(tmp_path, stack_dump_s=-1)


def test_one_monitor_per_process_holds_the_watchdog(tmp_path: Path) -> None:
    first = _monitor(tmp_path / "a", stack_dump_s=60)
    second = _monitor(tmp_path / "b", stack_dump_s=60)
    try:
        assert first._stall is not None and first._stall.watchdog is not None
        assert second._stall is not None and second._stall.watchdog is None
    finally:
        second.close()
        first.close()
    third = _monitor(tmp_path / "c", stack_dump_s=60)  # the first one let go at close
    try:
        assert third._stall is not None and third._stall.watchdog is not None
    finally:
        third.close()


def test_no_sample_while_stepping_nor_during_a_pause(tmp_path: Path) -> None:
    watch = stall.StallWatch(1, tmp_path / "rank0.jsonl", period_s=1.0, dump_s=0,
                             min_stall_s=2.0, interval_s=1.0)  # fmt: skip
    t = 1000.0
    for step in range(1, 6):  # a step a second: the usual step time is 1 s
        assert watch.beat(t, (step, t - 0.1), paused=False) is None
        t += 1.0
    assert watch.beat(t + 1.0, (5, t - 1.1), paused=False) is None  # 3 s: 3 step times
    assert watch.beat(t + 2.5, (5, t - 1.1), paused=True) is None  # a checkpoint
    assert watch.beat(t + 5.0, None, paused=False) is None  # 2.5 s after it: not 3 steps yet
    sample = watch.beat(t + 6.0, None, paused=False)  # 3.5 s after the pause
    assert sample is not None and sample["step"] == 5 and sample["stalled_s"] == 3.5
