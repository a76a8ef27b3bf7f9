"""What a run's summary lists of its active divergences (``listing``), and the detector's
listing kept until a flag changes."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.divergence.listing import (
    KIND_ORDER,
    ActiveFlags,
    list_active,
    reading_order,
)
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.merge import StepValues


def div(rank: int, since: int, kind: str = "outlier", z: float = 5.0, metric: str = "loss") -> Any:
    return Divergence("r", metric, rank, kind, "high", since, since + 2, 1.0, 0.0, z, 2.0, "m")


def test_the_earliest_start_comes_first_then_kind_then_the_largest_z_then_rank_and_metric() -> None:
    active = [
        div(9, 30, z=9.0),
        div(4, 21, "nonfinite", math.nan, "grad_norm"),
        div(5, 21, "outlier", -12.0),
        div(6, 21, "outlier", 4.0),
        div(1, 21, "offset", 20.0),
        div(4, 21, "nonfinite", math.nan, "loss"),
        div(2, 20, "outlier", 3.1),
        div(3, 21, "nonfinite", math.nan),
    ]
    got = list_active(reversed(active))
    assert [(d.rank, d.kind, d.metric) for d in got.listed] == [
        (2, "outlier", "loss"),  # started first: the card that started it
        (3, "nonfinite", "loss"),
        (4, "nonfinite", "grad_norm"),
        (4, "nonfinite", "loss"),
        (5, "outlier", "loss"),  # |z| 12 before |z| 4
        (6, "outlier", "loss"),
        (1, "offset", "loss"),
        (9, "outlier", "loss"),
    ]
    assert got.total == 8 and got.ranks == {1, 2, 3, 4, 5, 6, 9}
    assert list(got.by_kind.items()) == [("nonfinite", 3), ("outlier", 4), ("offset", 1)]


def test_a_cascade_lists_the_first_few_and_counts_every_one() -> None:
    # one card's NaN at step 20, every other card's at 21, on four metrics
    metrics = ("loss", "grad_norm", "grad_norm_local", "update_ratio")
    active = [div(r, 20 if r == 7 else 21, "nonfinite", math.nan, m)
              for r in range(5000) for m in metrics]  # fmt: skip
    random.Random(3).shuffle(active)
    got = list_active(active, limit=10)
    assert got.total == 20_000 and got.by_kind == {"nonfinite": 20_000}
    assert [(d.rank, d.metric) for d in got.listed] == [
        *((7, m) for m in sorted(metrics)), *((0, m) for m in sorted(metrics)), (1, "grad_norm"),
        (1, "grad_norm_local")]  # fmt: skip
    assert got.listed == sorted(active, key=reading_order)[:10]
    assert len(got.ranks) == 5000
    assert list_active(active, limit=0).listed == [] and list_active([]).total == 0


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be 0 or more, got -1"):
        list_active([], limit=-1)


def test_every_kind_the_detector_flags_has_an_order() -> None:
    # the kinds a (run, metric)'s flags are keyed by: a new one must be given its place
    assert set(KIND_ORDER) == {"nonfinite", "outlier", "offset", "straggler"}


def test_the_flags_take_a_new_version_at_every_change_and_none_at_a_read() -> None:
    flags = ActiveFlags()
    seen = [flags.version]

    def changed() -> bool:
        new = flags.version not in seen
        seen.append(flags.version)
        return new

    flags[(1, "outlier")] = div(1, 3)
    assert changed()
    _ = flags.get((1, "outlier")), (1, "outlier") in flags, list(flags.items()), len(flags)
    assert not changed()
    flags.update({(2, "outlier"): div(2, 3)})
    assert changed()
    flags.setdefault((3, "nonfinite"), div(3, 4, "nonfinite"))
    assert changed()
    flags |= {(4, "offset"): div(4, 5, "offset")}
    assert changed() and isinstance(flags, ActiveFlags)
    assert flags.pop((1, "outlier")).rank == 1
    assert changed()
    del flags[(2, "outlier")]
    assert changed()
    flags.popitem()
    assert changed()
    flags.clear()
    assert changed() and not flags
    with pytest.raises(KeyError):
        flags.pop((9, "outlier"))
    assert flags.pop((9, "outlier"), None) is None
    assert ActiveFlags().version != flags.version  # two flags' versions never coincide


def _step(run: str, step: int, values: dict[int, float]) -> StepValues:
    return StepValues(run, "loss", step, values, len(values), True)


def test_the_detectors_listing_is_kept_until_a_flag_changes() -> None:
    det = DivergenceDetector()
    rng = random.Random(5)

    def clean() -> dict[int, float]:
        return {r: 1.0 + 0.01 * rng.gauss(0, 1) for r in range(16)}

    for step in range(1, 11):
        det.update(_step("a", step, clean()))
        det.update(_step("b", step, clean()))
    empty = det.listing("a")
    assert empty.total == 0 and det.listing("a") is empty
    det.update(_step("a", 11, {**clean(), 3: math.nan, 5: math.inf}))
    flagged = det.listing("a")
    assert flagged is not empty and flagged.total == 2 and flagged.ranks == {3, 5}
    assert [d.rank for d in flagged.listed] == [3, 5]
    det.update(_step("b", 11, clean()))  # another run's step: ``a``'s listing stands
    det.update(_step("a", 12, {**clean(), 3: math.nan, 5: math.inf}))  # still flagged: same
    assert det.listing("a") is flagged and det.listing("b").total == 0
    assert det.flagged_on("a", range(16)) == {3: {"loss"}, 5: {"loss"}}
    assert det.flagged_on("a", [5, 6]) == {5: {"loss"}} and det.flagged_on("b", [3]) == {}
    for step in range(13, 13 + det.config.clear_steps):  # finite again: resolved
        det.update(_step("a", step, clean()))
    assert det.listing("a").total == 0 and det.flagged_on("a", [3, 5]) == {}
    det.update(_step("a", 20, {**clean(), 8: math.nan}))
    assert det.listing("a").ranks == {8}
    det.forget("a")
    assert det.listing("a").total == 0


def test_flagged_on_agrees_with_every_active_divergence() -> None:
    det = DivergenceDetector()
    rng = random.Random(11)
    metrics = ("loss", "grad_norm", "throughput")
    for step in range(1, 30):
        for metric in metrics:
            values = {r: 1.0 + 0.01 * rng.gauss(0, 1) for r in range(40)}
            for r in rng.sample(range(40), 3):  # a few ranks far off, now and then NaN
                values[r] = math.nan if rng.random() < 0.2 else 3.0
            det.update(StepValues("r", metric, step, values, 40, True))
    every: dict[int, set[str]] = {}
    for d in det.active("r"):
        every.setdefault(d.rank, set()).add(d.metric)
    assert len(every) > 5  # the check below compares something
    assert det.flagged_on("r", range(40)) == every
    listing = det.listing("r")
    assert listing.total == len(det.active("r")) and listing.ranks == set(every)


def test_a_runs_reads_are_its_own_among_many_runs_and_forget_drops_only_it() -> None:
    det = DivergenceDetector()
    for run in ("a", "b", "c"):
        for step in range(1, 4):
            values = {r: 1.0 for r in range(8)}
            if run != "b" and step == 3:
                values[2 if run == "a" else 5] = math.nan
            det.update(_step(run, step, values))
            det.update(StepValues(run, "lr", step, {r: 0.1 for r in range(8)}, 8, True))
    assert [(d.run, d.rank) for d in det.active("a")] == [("a", 2)]
    assert det.active("b") == [] and len(det.active()) == 2
    assert det.listing("c").ranks == {5} and det.flagged_on("c", range(8)) == {5: {"loss"}}
    det.forget("a")
    assert det.active("a") == [] and det.listing("a").total == 0
    assert [(d.run, d.rank) for d in det.active()] == [("c", 5)]
    det.update(_step("a", 1, {r: 1.0 for r in range(8)}))  # the run again, from scratch
    assert det.active("a") == [] and det.listing("c").total == 1
