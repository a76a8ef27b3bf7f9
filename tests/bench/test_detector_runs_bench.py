"""bench/detector_runs.py at a CI size: a row per run count, the pass over every run with the
detector's states kept by run beside a walk over every run's states per run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "detector_runs.py"


def test_detector_runs_prints_both_passes_per_run_count() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--runs", "10,300", "--repeat", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["10", "300"], proc.stdout
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and r[3].endswith("x") for r in rows)
    bad = subprocess.run([sys.executable, str(BENCH), "--repeat", "0"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--repeat must be 1 or more" in bad.stderr
