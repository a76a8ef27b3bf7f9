"""bench/false_alarms.py, bench/detection_quality.py, bench/onset_dates.py and
bench/stream_fanout.py at a CI size: they run end to end and print what docs/benchmarks.md
quotes."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_false_alarms_model_holds_a_run_at_or_under_the_8_rank_level() -> None:
    out = run("false_alarms.py", "--ranks", "64", "--steps", "300", "--seeds", "1")
    model = [
        (float(limit), float(rate))
        for limit, rate in re.findall(r"^ *(\d\.\d\d) +(\d+\.\d+)", out, re.M)
    ]
    limits = [limit for limit, _ in model]
    assert limits == sorted(limits) and {3.0, 3.5, 4.0, 4.5, 7.2} <= set(limits), out
    rates = [rate for _, rate in model]
    assert all(a > b for a, b in itertools.pairwise(rates)), out  # a higher limit, fewer flags
    assert len(re.findall(r"\(\d+ flags\)", out)) == 3, out  # the real detector's rows
    hours = {
        int(n.replace(",", "")): (float(limit), float(flat), float(grown))
        for n, limit, flat, grown in re.findall(
            r"^ *([\d,]+) +(\d\.\d\d) +(\d+\.\d+) +(\d+\.\d+) +\d+\.\d+$", out, re.M
        )
    }
    assert list(hours) == [8, 64, 512, 1_024, 4_096], out
    base = hours[8][2]
    grown_by_n = [grown for _, _, grown in hours.values()]
    # the limit grows faster than the rate halves: bigger worlds spend less, never more
    assert grown_by_n == sorted(grown_by_n, reverse=True) and grown_by_n[-1] < 0.5 * base, out
    for n, (_, flat, grown) in hours.items():
        assert flat >= grown, (n, out)
    assert hours[4_096][0] == 7.2 and hours[4_096][1] > 1_000 * hours[4_096][2], out


def test_detection_quality_takes_the_limit_setting() -> None:
    args = ("--ranks", "64", "--trials", "1", "--clean-steps", "30", "--seeds", "1")
    grown = run("detection_quality.py", *args)
    flat = run("detection_quality.py", *args, "--evidence-per-doubling", "0")
    assert "CUSUM limit 5.40 (evidence_per_doubling 0.3)" in grown, grown
    assert "CUSUM limit 4.50 (evidence_per_doubling 0)" in flat, flat
    for out in (grown, flat):
        assert re.search(r"^drift 3 sigma +\| +\d+\.\d%", out, re.M), out
        assert "false flags, clean runs" in out, out


def test_stream_fanout_prints_a_row_per_page_count() -> None:
    out = run("stream_fanout.py", "--ranks", "256", "--steps", "4", "--pages", "1,3")
    rows = re.findall(r"^ +(\d+) +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d+) +(\d+)$", out, re.M)
    assert [int(r[0]) for r in rows] == [1, 3], out
    assert all(
        float(own) > 0 and float(shared) > 0 and int(kb) > 0 for _, own, shared, _, kb in rows
    )


def test_alarm_budget_prints_the_ceiling_beside_both_tests() -> None:
    out = run(
        "alarm_budget.py", "--worlds", "1024", "--trials", "10000", "--hours", "64:0.02"
    )  # fmt: skip
    row = re.search(r"^ 1,024 +(\S+) +([\d.]+) +([\d.]+) \|(.*)$", out, re.M)
    assert row, out
    ceil3 = float(row.group(2))
    cells = [float(x) for x in row.group(4).replace("|", " ").split()]
    limit, per_hour, cusum, _, _, _, _, share, h, window, either, of_ceil, four = cells
    assert limit == 6.6 and 10 < h < 12, out
    assert share == pytest.approx(0.1 - per_hour, abs=2e-3), out  # the window gets the rest
    assert either >= max(cusum, window) and of_ceil == pytest.approx(either / ceil3, abs=2e-3)
    assert of_ceil >= 0.94 and cusum / ceil3 < 0.93 and four > 0.99, out
    assert re.search(r"^ 1,024 CUSUM alone: (0\.\d{3} ){6}\| CUSUM or window:", out, re.M), out
    assert re.search(r"^ +64 +0\.02 +\d+ ", out, re.M), out


def test_alarm_budget_measures_the_real_detectors_recall_on_a_drift() -> None:
    out = run(
        "alarm_budget.py", "--no-model", "--worlds", "8", "--drift-trials", "40",
        "--hours", "8:0.01", "--baseline-steps", "0",
    )  # fmt: skip
    rows = re.findall(r"^ +8 (\d) sigma \(CUSUM limit ([\d.]+)\): ([\d.]+) \(((?:[\d.]+ ?){6})\)$",
                      out, re.M)  # fmt: skip
    assert [r[0] for r in rows] == ["3", "4"], out
    # the 8-rank limit is derived on that world's law of z, above the grown 4.50
    assert all(float(r[1]) > 4.5 for r in rows), out
    three, four = (float(r[2]) for r in rows)
    assert 0.1 < three < four and four > 0.7, out
    for r in rows:  # the delays are shares of the trials, the last one "later"
        shares = [float(x) for x in r[3].split()]
        assert sum(shares) == pytest.approx(1.0, abs=0.01)
        assert sum(shares[:5]) == pytest.approx(float(r[2]), abs=0.01)


def test_onset_dates_prints_both_estimates_and_the_new_one_is_not_worse_on_a_large_shift() -> None:
    out = run("onset_dates.py", "--ranks", "16", "--shifts", "50", "--trials", "60",
              "--slopes", "0.5")  # fmt: skip
    assert "flagged 60/60" in out, out
    (now,) = re.findall(r"now: +exact (\d\.\d+)", out)
    (before,) = re.findall(r"baseline: +exact (\d\.\d+)", out)
    # 60 seeds of 16 ranks: the run-start estimate dates some of them early, the new one ~none
    assert float(now) >= 0.95 and float(now) > float(before), out
    assert re.search(r"exact dates, now / baseline: \d\.\d\dx", out), out
    # a ramp of 0.5 sigma a step is flagged well into it, and dated after its start
    (ramp,) = re.findall(r"ramp 0.5 sigma/step .*: now ([+-]\d+\.\d\d), baseline", out)
    assert 0 < float(ramp) < 8, out
