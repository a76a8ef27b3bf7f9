"""bench/stored_ranks.py at a CI size: a row per size with before, now and their ratio (the
bench itself stops when the two codings differ); bad sizes are refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "stored_ranks.py"


def test_stored_ranks_bench_prints_a_row_per_size() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--ranks", "1,64,2000", "--reads", "3"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = r"^ +(\d+) +\d+\.\d+ ms +\d+\.\d+ ms +\d+\.\dx$"
    assert [int(n) for n in re.findall(row, proc.stdout, re.M)] == [1, 64, 2000], proc.stdout


def test_stored_ranks_bench_refuses_bad_sizes() -> None:
    for bad in (["--ranks", "0"], ["--ranks", "ten"], ["--hosts-per", "0"]):
        proc = subprocess.run([sys.executable, str(BENCH), *bad], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 2 and "--" in proc.stderr, (bad, proc.stderr)
