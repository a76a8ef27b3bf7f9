"""Cross-rank hardware outliers and fault flags: table-driven, no clock (record times only)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest
from rankwatch.aggregator.telemetry.cards import card_note, leaders, rank_rows
from rankwatch.aggregator.telemetry.outliers import Finding, HardwareConfig, HardwareWatch


@dataclass(frozen=True)
class Rec:
    run: str
    rank: int
    time: float
    host: str
    source: str
    device: str
    values: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


Values = Callable[[int, int, random.Random], dict[str, float]]


def clean(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
    return {
        "gpu/temp_c": 62 + (rank % 5) + rnd.gauss(0, 1.5),
        "gpu/sm_clock_mhz": 1980 + rnd.gauss(0, 10),
        "gpu/util_pct": min(100.0, 93 + rnd.gauss(0, 3)),
        "gpu/mem_used_bytes": 60e9 + rnd.gauss(0, 2e8),
        "gpu/power_w": 650 + rnd.gauss(0, 15),
        "gpu/throttle_mask": 0.0,
        "gpu/ecc_uncorrected_total": 0.0,
    }


def feed(
    watch: HardwareWatch, samples: int, ranks: int = 16, values: Values = clean,
    per_host: int = 8, start: float = 1000.0, interval: float = 10.0, seed: int = 1,
) -> list[list[Finding]]:  # fmt: skip
    """Every rank samples at its own phase; the watch is evaluated after each round."""
    rnd = random.Random(seed)
    out = []
    for i in range(samples):
        recs = [
            Rec("r", rank, start + i * interval + (rank * 0.37) % interval,
                f"node{rank // per_host}", "gpu", f"gpu:{rank % per_host}", values(rank, i, rnd))
            for rank in range(ranks)
        ]  # fmt: skip
        watch.add(recs)
        out.append(watch.evaluate())
    return out


def hot_from_10(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
    """Clean cards, but rank 5 at 94 C from sample 10 on."""
    v = clean(rank, i, rnd)
    if rank == 5 and i >= 10:
        v["gpu/temp_c"] = 94.0
    return v


def hot_5(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
    """Clean cards, but rank 5 at 94 C throughout."""
    return {**clean(rank, i, rnd), **({"gpu/temp_c": 94.0} if rank == 5 else {})}


def flagged(found: list[Finding]) -> set[tuple[str, int | None]]:
    return {(f.rule, f.rank) for f in found}


def test_clean_telemetry_flags_nothing() -> None:
    rounds = feed(HardwareWatch(), 60, ranks=64)
    assert all(not r for r in rounds)


def test_a_hot_card_is_named_after_the_confirm_buckets_and_no_other() -> None:
    watch = HardwareWatch()
    rounds = feed(watch, 20, values=hot_from_10)
    assert all(not r for r in rounds[:12])  # scored one bucket late, confirmed over three
    assert flagged(rounds[-1]) == {("hw_hot", 5)}
    (f,) = rounds[-1]
    assert "rank 5 (gpu:5 on node0)" in f.message and "94 °C" in f.message
    assert f.since_time == pytest.approx(1100.0)
    note = card_note(watch, "r", 5)
    assert note is not None and note.startswith("card 5 (gpu:5 on node0) at 94 °C")
    assert card_note(watch, "r", 4) is None
    (lead,) = [d for d in leaders(watch, "r") if d["metric"] == "gpu/temp_c"]
    assert lead["rank"] == 5 and lead["flagged"] and lead["word"] == "hottest"


def test_a_card_back_to_normal_clears_after_the_clean_buckets() -> None:
    def spell(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        if rank == 3 and 5 <= i < 15:
            v["gpu/sm_clock_mhz"] = 1300.0
        return v

    rounds = feed(HardwareWatch(), 25, values=spell)
    assert any(flagged(r) == {("hw_clock", 3)} for r in rounds)
    assert "SM clock 1300 MHz, 66% of the median of 16 cards" in next(
        f.message for r in rounds for f in r
    )
    assert not rounds[-1]


def test_a_lone_cold_or_idle_card_is_no_fault() -> None:
    """One way only: a cooler card, a higher clock or less memory used is not a fault."""

    def odd(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        if rank == 2:
            v.update({"gpu/temp_c": 35.0, "gpu/sm_clock_mhz": 2100.0, "gpu/mem_used_bytes": 1e9})
        return v

    assert all(not r for r in feed(HardwareWatch(), 20, values=odd))


def test_small_differences_between_agreeing_cards_are_no_fault() -> None:
    """A 5 °C warmer card among cards within 0.1 °C of each other passes the z (its scale is the
    1 °C floor), but is no fault: the effect gate wants 8 °C."""

    def tight(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        return {"gpu/temp_c": 60.0 + rnd.gauss(0, 0.05) + (5.0 if rank == 1 else 0.0)}

    assert all(not r for r in feed(HardwareWatch(), 20, values=tight))


def test_an_ecc_increase_fires_at_once_and_is_held() -> None:
    def burst(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        if rank == 9:
            v["gpu/ecc_uncorrected_total"] = 0.0 if i < 4 else 12.0
        return v

    watch = HardwareWatch(HardwareConfig(ecc_hold_s=60.0))
    rounds = feed(watch, 14, values=burst)
    assert not rounds[3] and flagged(rounds[4]) == {("hw_ecc", 9)}
    assert "uncorrectable ECC errors +12 (now 12)" in rounds[4][0].message
    assert flagged(rounds[9]) == {("hw_ecc", 9)} and not rounds[-1]  # held 60 s, then over
    assert card_note(watch, "r", 9) is not None


def test_health_not_ok_and_its_recovery() -> None:
    watch = HardwareWatch()
    base = {"npu/temp_c": 50.0, "npu/health_ok": 1.0}
    recs = [Rec("r", k, 10.0, "h0", "npu", f"npu:{k}", base) for k in range(4)]
    watch.add(recs)
    assert not watch.evaluate()
    watch.add([Rec("r", 2, 20.0, "h0", "npu", "npu:2", {"npu/health_ok": 0.0},
                   {"npu/health": "Warning"})])  # fmt: skip
    (f,) = watch.evaluate()
    assert (f.rule, f.rank, f.message) == ("hw_health", 2, "rank 2 (npu:2 on h0): health Warning")
    assert rank_rows(watch, "r")[2]["flags"] == ["health"]
    watch.add(
        [Rec("r", 2, 30.0, "h0", "npu", "npu:2", {"npu/health_ok": 1.0}, {"npu/health": "OK"})]
    )
    assert not watch.evaluate()


def test_throttle_needs_two_samples_and_a_shared_power_cap_is_no_fault() -> None:
    def throttled(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        v["gpu/throttle_mask"] = 0x4  # every card at its power cap: how a busy GPU runs
        if rank == 7 and i >= 3:
            v["gpu/throttle_mask"] = 0x4 | 0x40
        return v

    watch = HardwareWatch()
    rounds = feed(watch, 6, values=throttled)
    assert not rounds[3]
    assert flagged(rounds[4]) == {("hw_throttle", 7)}
    assert rounds[4][0].message.endswith("clock slowdown: sw_thermal")
    note = card_note(watch, "r", 7)
    assert note is not None and "sw thermal slowdown" in note


def test_one_card_at_its_power_cap_while_the_others_are_not_is_a_fault() -> None:
    def capped(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        v["gpu/throttle_mask"] = 0x4 if rank == 0 else 0x1  # idle bit: never a fault
        return v

    rounds = feed(HardwareWatch(), 3, values=capped)
    assert flagged(rounds[-1]) == {("hw_throttle", 0)}


def test_a_whole_node_slow_reads_as_one_node() -> None:
    def node(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        if 8 <= rank < 16 and i >= 2:
            v["gpu/sm_clock_mhz"] = 1200 + rnd.gauss(0, 10)
        return v

    rounds = feed(HardwareWatch(), 12, ranks=64, values=node)
    (f,) = rounds[-1]
    assert (f.rule, f.rank, f.metric, f.ranks) == (
        "hw_node", None, "gpu/sm_clock_mhz@node1", tuple(range(8, 16)),
    )  # fmt: skip
    assert f.message.startswith("node node1: 8 of 8 cards (ranks 8-15) slower-clocked")


def test_the_interval_is_learned_from_the_samples() -> None:
    def hot(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        v = clean(rank, i, rnd)
        v["gpu/temp_c"] += 30.0 if rank == 1 and i >= 4 else 0.0
        return v

    watch = HardwareWatch()
    rounds = feed(watch, 12, values=hot, interval=30.0)
    assert watch.width("r") == 30.0
    assert flagged(rounds[-1]) == {("hw_hot", 1)}


def test_too_few_ranks_are_not_scored_and_forget_drops_a_run() -> None:
    def hot(rank: int, i: int, rnd: random.Random) -> dict[str, float]:
        return {"gpu/temp_c": 99.0 if rank == 0 else 60.0}

    watch = HardwareWatch()
    assert all(not r for r in feed(watch, 10, ranks=3, values=hot))
    watch.forget("r")
    assert not watch.cards and not watch.peers


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"z_threshold": 0}, "z_threshold=0 is out of range"),
        ({"confirm": 3}, "unknown telemetry setting 'confirm'"),
        ({"confirm_buckets": 2.5}, "must be an integer"),
        ({"interval_s": "10s"}, "must be a number"),
    ],
)
def test_config_errors_name_the_setting(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HardwareConfig.from_dict(raw)


def test_late_cards_scored_after_a_newer_bucket_leave_the_leaders_to_the_newer_one() -> None:
    # 12 ranks with rank 5 hot, then rank 8-11's samples of an old bucket arriving late (their
    # sockets connected last): scored on their own, they must not stand for the run's peers
    watch = HardwareWatch(HardwareConfig())
    feed(watch, 6, ranks=8, values=hot_5)
    assert any(d["rank"] == 5 and d["word"] == "hottest" for d in leaders(watch, "r"))
    newest = watch.peers[("r", "gpu/temp_c")].time
    rnd = random.Random(2)
    late = [
        Rec("r", r, 1000.0 + 10 * i + 0.5, "node1", "gpu", f"gpu:{r}", clean(r, i, rnd))
        for i in range(3)
        for r in range(8, 12)
    ]
    watch.add(late)
    watch.evaluate()
    assert watch.peers[("r", "gpu/temp_c")].time == newest
    assert any(d["rank"] == 5 and d["word"] == "hottest" for d in leaders(watch, "r"))


def test_late_cards_of_the_newest_bucket_itself_join_its_view() -> None:
    # the same, but the late samples fall in the newest scored bucket (a burst of frames after
    # a reconnect): scored with that bucket's cards, not on their own, they join its peers
    watch = HardwareWatch(HardwareConfig())
    feed(watch, 6, ranks=8, values=hot_5)
    newest = watch.peers[("r", "gpu/temp_c")]
    rnd = random.Random(2)
    watch.add([Rec("r", r, newest.time + 0.5, "node1", "gpu", f"gpu:{r}", clean(r, 0, rnd))
               for r in range(8, 12)])  # fmt: skip
    watch.evaluate()
    joined = watch.peers[("r", "gpu/temp_c")]
    assert joined.time == newest.time and joined.n == 12 and set(joined.z) == set(range(12))
    assert any(d["rank"] == 5 and d["word"] == "hottest" for d in leaders(watch, "r"))


def test_cards_of_a_bucket_scored_again_do_not_count_twice_toward_a_flag() -> None:
    # every bucket's samples arrive again after it was scored (a relay resending after a
    # reconnect): scored again on their own, they must not add a bucket to the hot card's streak
    # and flag it a bucket early
    def first_flag(again: bool) -> int:
        watch, rnd = HardwareWatch(), random.Random(1)
        sent: list[list[Rec]] = []
        for i in range(20):
            recs = [Rec("r", rank, 1000.0 + i * 10 + (rank * 0.37) % 10, f"node{rank // 8}",
                        "gpu", f"gpu:{rank % 8}", hot_from_10(rank, i, rnd))
                    for rank in range(8)]  # fmt: skip
            sent.append(recs)
            watch.add(recs)
            if flagged(watch.evaluate()):
                return i
            if again and i >= 2:
                watch.add(sent[-3])  # a bucket the watch has scored already
                if flagged(watch.evaluate()):
                    return i
        raise AssertionError("never flagged")

    assert first_flag(again=True) == first_flag(again=False) == 14


def test_the_hot_card_arriving_after_its_bucket_was_scored_still_leads() -> None:
    # 32 sockets drain at their own pace: the other cards' newest samples closed the bucket
    # before the hot card's sample of it came; scored with the bucket's other cards, not alone,
    # it still leads (it used to vanish from the leaders while flagged: `status` lost the line)
    watch = HardwareWatch(HardwareConfig())
    feed(watch, 6, ranks=8, values=hot_5)
    rnd = random.Random(3)
    t0 = 1000.0 + 6 * 10
    watch.add([Rec("r", r, t0 + (r * 0.37) % 10, "node0", "gpu", f"gpu:{r}", clean(r, 6, rnd))
               for r in range(8) if r != 5])  # fmt: skip
    watch.add([Rec("r", r, t0 + 15 + (r * 0.37) % 10, "node0", "gpu", f"gpu:{r}",
                   clean(r, 7, rnd)) for r in range(8) if r != 5])  # fmt: skip
    watch.evaluate()
    peers = watch.peers[("r", "gpu/temp_c")]
    assert peers.time == 1060.0 and 5 not in peers.z  # scored without it
    watch.add([Rec("r", 5, t0 + 1.85, "node0", "gpu", "gpu:5", hot_5(5, 6, rnd))])
    watch.evaluate()
    peers = watch.peers[("r", "gpu/temp_c")]
    assert peers.time == 1060.0 and peers.n == 8 and peers.z[5] > 6
    lead = next(d for d in leaders(watch, "r") if d["word"] == "hottest")
    assert lead["rank"] == 5 and lead["flagged"]
