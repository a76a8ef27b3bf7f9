"""bench/incidents.py at a CI size: it runs end to end, prints every burst's cost and ratio, and
names the culprit in every seed; its judging part prints old and new per tick."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_incidents_bench_prints_costs_and_right_culprits() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "incidents.py"), "--ranks", "64", "--repeats", "2",
         "--seeds", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = re.findall(
        r"^(nan|crash|hang|timeouts) +(\d+) +(\d+\.\d+) +(\d+\.\d+) +(\d+)x$", out, re.M
    )
    assert [r[0] for r in rows] == ["nan", "crash", "hang", "timeouts"], out
    assert [int(r[1]) for r in rows] == [64, 64, 64 + 64, 63], out
    assert "per event at 64 and 256 ranks" in out, out
    growth = re.findall(r"^(nan|crash|hang|timeouts) +\d+\.\d+ +\d+\.\d+ +\d+\.\d+x$", out, re.M)
    assert growth == ["nan", "crash", "hang", "timeouts"], out
    assert re.findall(r"^  (\w+) +(\d+)/(\d+) seeds$", out, re.M) == [
        ("nan", "3", "3"), ("crash", "3", "3"), ("hang", "3", "3")
    ], out  # fmt: skip


def test_incidents_bench_refuses_bad_sizes() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "incidents.py"), "--ranks", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "--ranks must be >= 2" in proc.stderr


def test_the_judging_bench_prints_old_and_new_per_tick_with_the_same_incidents() -> None:
    # HEAD's incident modules beside this tree's: the bench stops when their incidents differ
    head = subprocess.run(["git", "-C", str(BENCH), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: no other revision to run beside this one")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "incidents.py"), "--judging", "--sizes", "400,800",
         "--ticks", "2", "--baseline", "HEAD"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^(lost|crash|hang|nan|stall) +(\d+) +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d)x$",
                      proc.stdout, re.M)  # fmt: skip
    assert [(r[0], r[1]) for r in rows] == [
        (name, size)
        for size in ("400", "800")
        for name in ("lost", "crash", "hang", "nan", "stall")
    ], proc.stdout


def test_the_judging_bench_refuses_sizes_too_small_for_its_ticks() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "incidents.py"), "--judging", "--sizes", "100",
         "--ticks", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "--sizes must be >= 200" in proc.stderr
