"""bench/cascade_step.py at a CI size: the cascade step's stream messages, a message per
divergence (before) against the first few and a count (now), in one run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cascade_step.py"


def test_cascade_step_prints_both_versions_and_only_the_old_one_loses_messages() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--ranks", "512", "--steps", "2", "--repeat", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = lines[1].split()
    rows = {line.split()[1]: line.split()[2:] for line in lines[2:4]}
    assert set(rows) == {"every", "now"}, proc.stdout
    col = {name: head.index(name) - 2 for name in ("messages", "lost", "points_kept")}
    every, now = rows["every"], rows["now"]
    # 511 ranks x 4 metrics flagged at once: a message each overflows the queue of 1,000
    assert float(every[col["lost"]]) > 0 and float(every[col["messages"]]) == 1000, proc.stdout
    assert float(now[col["lost"]]) == 0 and float(now[col["messages"]]) < 200, proc.stdout
    assert float(now[col["points_kept"]]) == 8, proc.stdout
    assert "cascade add every / now" in lines[4], proc.stdout
    assert lines[5].split()[1:2] == ["stages"] and "alerts" in lines[5], proc.stdout
    bad = subprocess.run([sys.executable, str(BENCH), "--steps", "1"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--steps must be 2 or more" in bad.stderr
