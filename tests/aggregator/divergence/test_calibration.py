"""The divergence defaults against the real 4-rank msrun loss traces in tests/fixtures.

Clean run: nothing is ever flagged. Rank 2's labels shifted from step 20: rank 2 is flagged by
step 24 and no other rank ever. Also every 3-rank and 2-rank subset of the same traces (the small
worlds take different code paths), and the margins: how far each default can move before one of
these requirements breaks, printed so a change that eats the margin is visible.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from rankwatch.aggregator.divergence.detector import DivergenceConfig, DivergenceDetector
from rankwatch.aggregator.merge import StepValues

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CLEAN = "msrun4_clean.csv"
FAULTY = "msrun4_rank2_labels_shifted_from_step20.csv"
ONSET, DEADLINE, BAD = 20, 24, 2


def load(name: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    with open(FIXTURES / name, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["step"]), {})[int(row["rank"])] = float(row["loss"])
    return out


def flags(
    trace: dict[int, dict[int, float]], config: DivergenceConfig, ranks: tuple[int, ...]
) -> list[tuple[int, int]]:
    """(step, rank) of every new divergence over the whole trace."""
    det = DivergenceDetector(config)
    out = []
    for step in sorted(trace):
        values = {r: trace[step][r] for r in ranks}
        res = det.update(StepValues("msrun4", "loss", step, values, len(ranks), True))
        out.extend((d.step, d.rank) for d in res.new)
    return out


def clean_ok(config: DivergenceConfig, ranks: tuple[int, ...] = (0, 1, 2, 3)) -> bool:
    return flags(load(CLEAN), config, ranks) == []


def faulty_ok(config: DivergenceConfig, ranks: tuple[int, ...] = (0, 1, 2, 3)) -> bool:
    got = flags(load(FAULTY), config, ranks)
    if BAD not in ranks:
        return got == []
    return bool(got) and all(r == BAD for _, r in got) and ONSET <= got[0][0] <= DEADLINE


def test_clean_run_is_never_flagged() -> None:
    assert flags(load(CLEAN), DivergenceConfig(), (0, 1, 2, 3)) == []


def test_shifted_labels_flag_rank_2_within_5_steps_and_no_other_rank() -> None:
    got = flags(load(FAULTY), DivergenceConfig(), (0, 1, 2, 3))
    assert got, "rank 2 was never flagged"
    assert {r for _, r in got} == {BAD}
    assert ONSET <= got[0][0] <= DEADLINE
    det = DivergenceDetector()
    trace = load(FAULTY)
    for step in sorted(trace):
        det.update(StepValues("msrun4", "loss", step, trace[step], 4, True))
    (active,) = det.active("msrun4")
    assert active.rank == BAD and active.since_step == ONSET and active.direction == "high"
    assert active.message.startswith("rank 2 loss ") and "the median of 4 ranks" in active.message


SUBSETS = [s for k in (2, 3) for s in itertools.combinations(range(4), k)]


@pytest.mark.parametrize("ranks", SUBSETS, ids=lambda r: "ranks" + "".join(map(str, r)))
def test_small_worlds_from_the_same_traces(ranks: tuple[int, ...]) -> None:
    assert clean_ok(DivergenceConfig(), ranks)
    assert faulty_ok(DivergenceConfig(), ranks)


# --- margins ---------------------------------------------------------------------------------


def boundary(ok: Callable[[float], bool], start: float, toward: float, steps: int = 40) -> float:
    """The value between ``start`` (ok) and ``toward`` where ``ok`` first fails (bisection).

    Returns ``toward`` itself when it never fails on the way.
    """
    assert ok(start)
    if ok(toward):
        return toward
    good, bad = start, toward
    for _ in range(steps):
        mid = (good + bad) / 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good


def with_(**kw: float) -> DivergenceConfig:
    return dataclasses.replace(DivergenceConfig(), **kw)


def all_ok(config: DivergenceConfig) -> bool:
    return clean_ok(config) and faulty_ok(config)


def amplified(
    trace: dict[int, dict[int, float]], rank: int, factor: float, after: int = 0
) -> dict[int, dict[int, float]]:
    """``rank``'s distance from the median of the other ranks times ``factor`` (from ``after``)."""
    out = {}
    for step, values in trace.items():
        values = dict(values)
        if step >= after:
            others = sorted(v for r, v in values.items() if r != rank)
            mid = len(others) // 2
            med = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
            values[rank] = med + factor * (values[rank] - med)
        out[step] = values
    return out


# setting, a value toward more false flags, a value toward missing rank 2
KNOBS = [("z_allowance", 0.0, 20.0), ("high_ratio", 1.0, 4.0), ("evidence_limit", 0.5, 40.0)]
ALL = (0, 1, 2, 3)


def test_margins_of_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    default = DivergenceConfig()
    clean, faulty = load(CLEAN), load(FAULTY)
    lines = ["divergence calibration margins (real 4-rank msrun traces, default config):"]

    # Data margins: how much noisier a healthy rank may be, how much smaller the fault.
    noise = min(
        boundary(lambda f, r=r: flags(amplified(clean, r, f), default, ALL) == [], 1.0, 20.0)
        for r in ALL
    )
    lines.append(
        f"  clean: any one rank's distance from the others can grow x{noise:.2f} "
        "before it is flagged"
    )

    def caught(fraction: float) -> bool:
        got = flags(amplified(faulty, BAD, fraction, after=ONSET), default, ALL)
        return bool(got) and {r for _, r in got} == {BAD} and got[0][0] <= DEADLINE

    smallest = boundary(caught, 1.0, 0.0)
    lines.append(
        f"  faulty: rank 2's excess over the others can shrink to {smallest:.1%} of the real "
        "one and still be caught by step 24"
    )
    got = flags(faulty, default, ALL)
    lines.append(
        f"  faulty: rank 2 flagged at step {got[0][0]} (onset {ONSET}, deadline {DEADLINE})"
    )

    # Setting margins: the range of each default over which both requirements still hold.
    for name, loose, strict in KNOBS:
        value = getattr(default, name)

        def ok(x: float, n: str = name) -> bool:
            config = dataclasses.replace(default, **{n: x})
            return clean_ok(config) and faulty_ok(config)

        low, high = boundary(ok, value, loose), boundary(ok, value, strict)
        lines.append(
            f"  {name}: default {value:g}, both requirements hold from {low:.3g} to {high:.3g}"
            + (" (the ends of the range tried)" if (low, high) == (loose, strict) else "")
        )
        assert low < value < high
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert noise >= 2.0  # a healthy rank twice as noisy as in the real run is still not flagged
    assert smallest <= 0.5  # a fault half this size is still caught in time
