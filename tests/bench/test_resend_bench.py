"""bench/resend_cost.py at a CI size: it runs end to end and prints a row per size, before and
now side by side with their ratio; bad sizes are refused. (How fast is the bench's to say.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_resend_bench_prints_before_and_now_per_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "resend_cost.py"), "--ranks", "256,1024", "--checks", "3",
         "--moving", "20"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    number = r"(\d+\.\d+) ms"
    row = rf"^ +(\d+) +{number} +{number} +(\d+)x +{number} +{number} +(\d+)x$"
    rows = re.findall(row, proc.stdout, re.M)
    assert [int(r[0]) for r in rows] == [256, 1024], proc.stdout
    assert "20 ranks' gaps moving" in proc.stdout


def test_resend_bench_refuses_sizes_below_the_moving_ranks() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "resend_cost.py"), "--ranks", "10", "--moving", "20"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "at least --moving ranks" in proc.stderr, proc.stderr
