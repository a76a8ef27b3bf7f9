"""bench/rank_restart.py at a CI size: it runs end to end and prints what docs/reliability.md
quotes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_rank_restart_bench_stores_every_step_of_every_incarnation() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "rank_restart.py"), "--restarts", "2", "--steps", "20"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "steps logged 60  stored 60  lost 0" in proc.stdout
    assert "restart events stored 2" in proc.stdout
    assert "ratio stored/logged 1.000" in proc.stdout
