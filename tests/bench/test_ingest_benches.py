"""bench/ingest.py and bench/store_flush.py at a CI size: they run end to end, every figure
printed, every setting taken."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_ingest_bench_prints_both_ratios_stages_and_flushes() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "ingest.py"), "--records", "4000", "--repeats", "1",
         "--stages", "--flush-log", "--duckdb-threads", "1", "--switch-interval", "0.001"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    ratios = re.findall(r"ratio accepted/baseline (\d\.\d+)\s+stored/baseline (\d\.\d+)", out)
    assert len(ratios) == 2, out  # single-record and batched frames
    for accepted, stored in ratios:
        assert 0 < float(stored) <= float(accepted) + 1e-9, out
    stages = re.findall(r"stage (.+?)\s{2,}(\d+\.\d+) us/record CPU", out)
    assert len(stages) == 2 * 10, out  # (a stage may round to 0.00 at this size)
    assert all(float(us) > 0 for name, us in stages if name.startswith("msg")), out
    against_msgspec = re.findall(r"against the msgspec loop: accepted (\d\.\d+)", out)
    assert len(against_msgspec) == 2 and all(float(r) > 0 for r in against_msgspec), out
    # the batched run's flushes: when, how long, and the flush thread's CPU
    flushes = re.findall(r"flush at +\d+\.\d+ s: +([\d,]+) records, wall +\d+ ms", out)
    assert flushes and sum(int(n.replace(",", "")) for n in flushes) <= 4_000, out


def test_store_flush_bench_prints_each_size_and_the_lock_cost() -> None:
    def run(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(BENCH / "store_flush.py"), *args],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    out = run("--sizes", "1000,2000", "--flushes", "1")
    row = r"^(blocks|records) +(\d+) +(\d+\.\d+) +(\d+\.\d+) +\( *[\d.]+x\) +(\d+\.\d+)"
    rows = re.findall(row, out, re.M)
    assert [(kind, int(n)) for kind, n, *_ in rows] == [
        ("blocks", 1000), ("blocks", 2000), ("records", 1000), ("records", 2000)
    ], out  # fmt: skip
    for _, _, wall, cpu, proc in rows:
        assert float(wall) > 0 and float(proc) >= float(cpu) > 0, out
    out = run("--lock")
    lock = re.findall(r"DuckDB threads (\d): alone +[\d.]+ +beside a busy thread +[\d.]+", out)
    assert lock == ["2", "1"], out
