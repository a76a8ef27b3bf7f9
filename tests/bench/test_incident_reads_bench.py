"""bench/incident_reads.py at a CI size: a row per size with before, now, their ratio and the
read after a flush; bad sizes are refused (how fast is the bench's to say)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "incident_reads.py"


def test_incident_reads_bench_prints_a_row_per_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--ranks", "64,512", "--updates", "3", "--reads", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = r"^ +(\d+) +\d+\.\d+ ms +\d+\.\d+ ms +\d+x +\d+\.\d+ ms$"
    assert [int(n) for n in re.findall(row, proc.stdout, re.M)] == [64, 512], proc.stdout


def test_incident_reads_bench_refuses_a_tiny_job() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--ranks", "4"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "--ranks of at least 10" in proc.stderr, proc.stderr
