"""bench/resend_cost.py at a CI size: it runs end to end and prints a row per size, before and
now side by side with their ratio; bad sizes are refused (how fast is the bench's to say). And
its baseline, the sweep of every gap, asks for the same gaps as the resender does now."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

from rankwatch.aggregator.resend import RESEND_CHECK_S, Resender
from rankwatch.aggregator.seqs import SeqTracker
from resend_cost import before

from tests.aggregator.test_resend import Agents, Looks, health_of

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


def test_random_gaps_are_asked_for_as_a_sweep_of_every_gap_asks_for_them() -> None:
    rng = random.Random(7)
    ranks = 40
    health = health_of("r", range(ranks))
    seqs_new, seqs_old = SeqTracker(), SeqTracker()
    res, new, old = Resender(), Agents(), Agents()
    asked: dict[tuple[str, int], tuple[tuple[int, int], int, float]] = {}
    top = dict.fromkeys(range(ranks), 0)
    t = 0.0
    for _ in range(2000):
        for _ in range(rng.randrange(4)):
            rank = rng.randrange(ranks)
            if rng.random() < 0.7:  # the next records, some lost on the way
                top[rank] += rng.randrange(1, 4)
                seq = top[rank]
            else:  # a resent one
                seq = rng.randrange(1, top[rank] + 2)
            for seqs in (seqs_new, seqs_old):
                seqs.accept("r", rank, seq)
        new.now = old.now = t
        res.request(health, t, seqs_new, Looks(), new.request)
        before(asked, health, t, seqs_old, old.request)
        t += RESEND_CHECK_S
    assert len(new.sent) > 100
    assert sorted(new.sent) == sorted(old.sent)
