"""bench/status_cost.py at a CI size: a row per size with every read it times, a big run's
`/divergence` among them (listed as `/api/status` lists ranks: a few KB, not every rank)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "status_cost.py"


def test_status_cost_prints_every_read_for_each_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--ranks", "64,1500", "--steps", "2", "--repeat", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = lines[1].split()
    for col in ("divergence_ms", "divergence_kb", "divergence_every_rank_ms", "status_ms"):
        assert col in head, proc.stdout
    rows = {
        int(line.split()[0].replace(",", "")): re.findall(r"(\d+\.\d) \( *\d+\.\dx\)", line)
        for line in lines[2:]
    }
    assert list(rows) == [64, 1500] and all(len(r) == len(head) - 1 for r in rows.values())
    kb = {n: float(row[head.index("divergence_kb") - 1]) for n, row in rows.items()}
    # the big run lists its odd rank (rank 3, far off on the loss), not 1,500 entries
    assert kb[1500] < 10 * kb[64], (kb, proc.stdout)
