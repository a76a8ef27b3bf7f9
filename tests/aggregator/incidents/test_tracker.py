"""Incident rules, table-driven: who started it, who it reached, when it is a second fault."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.incidents.timeline import ranges
from rankwatch.aggregator.incidents.tracker import IncidentConfig, IncidentTracker

from tests.aggregator.incidents.builders import (
    IN_ALLREDUCE,
    IN_SLEEP,
    RUN,
    T0,
    crash_text,
    crashed,
    health,
    nan,
    outlier,
    stack,
)
from tests.aggregator.incidents.scenario import deliver, world

WORLDS = [2, 4, 64, 4096]
SEEDS = range(5)
PEER_FAILURES = [
    "mindspore_allreduce_kernel.txt", "mindspore_hccl_timeout.txt",
    "mindspore_gloo_peer_closed.txt", "torch_gloo_timeout.txt", "torch_nccl_watchdog.txt",
    "torch_nccl_system_error.txt",
]  # fmt: skip


def only(tracker: IncidentTracker):
    (inc,) = tracker.incidents(RUN)
    return inc


def others(n: int, culprit: int) -> tuple[int, ...]:
    return tuple(r for r in range(n) if r != culprit)


# --- non-finite ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_nan_that_spreads_names_the_first_rank(n: int, seed: int) -> None:
    culprit = (seed * 7 + 1) % n
    t = IncidentTracker()
    deliver(t, world(n))
    # The loss is non-finite on the culprit at step 20, everywhere at 21; a gradient norm taken
    # after the all-reduce is non-finite on every rank already at 20.
    items = [("divergences", nan(culprit, 20))]
    items += [("divergences", nan(r, 21)) for r in others(n, culprit)]
    items += [("divergences", nan(r, 20, "grad_norm")) for r in range(n)]
    changes = deliver(t, items, seed=seed, passes=3)
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("nonfinite", (culprit,), others(n, culprit))
    assert inc.step == 20 and inc.state == "firing" and inc.terminated == ()
    assert inc.timeline[0].rank == culprit and inc.timeline[0].step == 20
    assert [c.change for c in changes].count("opened") == 1
    assert f"rank {culprit}" in inc.summary and "step 20" in inc.summary


def test_late_culprit_record_updates_the_culprit() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    first = t.observe(T0 + 100, divergences=[nan(r, 21) for r in (0, 1, 3)])
    assert [c.change for c in first] == ["opened"] and first[0].incident.culprits == (0, 1, 3)
    late = t.observe(T0 + 101, divergences=[nan(2, 20)])
    assert [c.change for c in late] == ["updated"]
    assert late[0].incident.culprits == (2,) and late[0].previous.culprits == (0, 1, 3)
    assert late[0].incident.affected == (0, 1, 3)


def test_ties_at_the_first_step_are_ordered_by_record_time() -> None:
    t = IncidentTracker()
    deliver(t, world(8))
    times = {(RUN, 5, 20): T0 + 1.0, (RUN, 2, 20): T0 + 1.5}
    t.observe(T0 + 100, divergences=[nan(2, 20), nan(5, 20)] + [nan(r, 21) for r in (0, 1, 3)],
              times=times)  # fmt: skip
    inc = only(t)
    assert inc.culprits == (5, 2) and inc.affected == (0, 1, 3)
    assert inc.summary.startswith("ranks 5, 2 went non-finite first")


def test_every_rank_at_once_has_no_single_culprit() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, divergences=[nan(r, 20) for r in range(4)])
    inc = only(t)
    assert inc.culprits == (0, 1, 2, 3) and "no single culprit" in inc.basis
    assert inc.summary.startswith("every rank went non-finite at step 20 at once")


def test_grouped_nonfinite_alert_is_evidence_too() -> None:
    t = IncidentTracker()
    deliver(t, world(16))
    alert = Alert("k", "nonfinite", "critical", "firing", RUN, None, "loss", 21, T0, T0,
                  None, "16 ranks non-finite", tuple(range(16)))  # fmt: skip
    t.observe(T0 + 100, divergences=[nan(9, 20)], alerts=[alert])
    inc = only(t)
    assert inc.culprits == (9,) and inc.affected == others(16, 9)


def test_a_grouped_alert_after_the_verdicts_leaves_their_ranks_where_they_were() -> None:
    # The alert engine's grouped alert is dated to its earliest rank's step: a tick after the
    # ranks' own verdicts are in an open incident, it must not move them back to the culprit's.
    t = IncidentTracker()
    deliver(t, world(16))
    t.observe(T0 + 100, divergences=[nan(9, 20)])
    t.observe(T0 + 101, divergences=[nan(r, 21) for r in others(16, 9)])
    alert = Alert("k", "nonfinite", "critical", "firing", RUN, None, "loss", 20, T0 + 100,
                  T0 + 102, None, "16 ranks non-finite", tuple(range(16)))  # fmt: skip
    t.observe(T0 + 102, alerts=[alert])
    inc = only(t)
    assert inc.culprits == (9,) and inc.affected == others(16, 9)


# --- crash -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_crash_then_peer_failures_then_kills(n: int, seed: int) -> None:
    culprit = (seed * 5 + 2) % n
    t = IncidentTracker()
    deliver(t, world(n, step=20))
    root = crashed(culprit, "RuntimeError: injected fault: rank 2 crashed at step 20", world=n)
    peers = others(n, culprit)
    failing, killed = peers[: max(1, len(peers) * 3 // 4)], peers[max(1, len(peers) * 3 // 4) :]
    items = [("health", root)]
    items += [
        ("health", crashed(r, crash_text(PEER_FAILURES[r % 6]), world=n, since=T0 + 30 + r / n))
        for r in failing
    ]
    items += [("health", health(r, RankState.LOST, world=n, since=T0 + 41)) for r in killed[::2]]
    items += [
        (
            "health",
            health(r, RankState.FINISHED, world=n, since=T0 + 31, message="finished (SIGTERM)"),
        )
        for r in killed[1::2]
    ]
    deliver(t, items, seed=seed, passes=4)
    inc = only(t)
    assert (inc.cause, inc.culprits) == ("crash", (culprit,))
    assert inc.affected == tuple(failing) and inc.terminated == tuple(killed)
    assert "injected fault" in inc.summary and "\n" not in inc.summary
    # the peers' failures in a collective at step 20 are one item, whatever their wording
    (peer_failures,) = [e for e in inc.timeline if e.count == len(failing) and e.rank != culprit]
    assert peer_failures.step == 20 and peer_failures.what.startswith("crashed: ")
    assert peer_failures.ranks == (ranges(list(failing)) if len(failing) > 1 else ())


@pytest.mark.parametrize("split", [False, True])
def test_a_crash_arriving_after_its_consequences_is_still_their_cause(split: bool) -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    lost = [health(r, RankState.LOST, since=T0 + 41) for r in (0, 3)]
    timeouts = [crashed(2, crash_text("torch_nccl_watchdog.txt"), since=T0 + 30)]
    root = [crashed(1, "RuntimeError: injected fault", since=T0 + 1)]
    if split:  # the root crash in a later pass than the losses and timeouts it explains
        t.observe(T0 + 100, health=lost + timeouts)
        t.observe(T0 + 101, health=root)
    else:
        t.observe(T0 + 100, health=lost + timeouts + root)
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected, inc.terminated) == ("crash", (1,), (2,), (0, 3))
    assert inc.opened == (T0 + 30 if split else T0 + 1)  # when its first evidence happened


def test_same_error_on_every_rank_is_one_bug() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    text = crash_text("user_valueerror.txt")
    t.observe(T0 + 100, health=[crashed(r, text, since=T0 + r * 0.01) for r in range(4)])
    inc = only(t)
    assert inc.cause == "crash" and inc.culprits == (0, 1, 2, 3) and inc.affected == ()


def test_every_rank_failing_in_a_collective_names_the_first() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    text = crash_text("torch_nccl_system_error.txt")
    t.observe(T0 + 100, health=[crashed(r, text, since=T0 + (3 - r)) for r in range(4)])
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("crash", (3,), (0, 1, 2))
    assert inc.basis == "first to fail; every rank failed in a collective"


# --- hang ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_hang_named_by_stacks_then_peers_time_out(n: int, seed: int) -> None:
    culprit = (seed * 3 + 1) % n
    t = IncidentTracker()
    deliver(t, world(n))
    stalls = [
        ("health", health(r, RankState.STALLED, world=n, since=T0 + 30 + (r % 3) * 0.1,
                          progress=T0 + (r % 5) * 0.01))
        for r in range(n)
    ]  # fmt: skip
    stacks = [
        ("stacks", stack(r, "sleep" if r == culprit else "framework",
                         IN_SLEEP if r == culprit else IN_ALLREDUCE, time=T0 + 35))
        for r in range(n)
    ]  # fmt: skip
    deliver(t, stalls + stacks, seed=seed, passes=2)
    inc = only(t)
    assert (inc.cause, inc.culprits) == ("hang", (culprit,)), inc.basis
    assert inc.basis.startswith("stacks:") and f"rank {culprit} in job/train.py:98" in inc.basis
    assert "AllReduce" in inc.basis
    # then the peers time out in the collective and the launcher kills the culprit
    timeouts = [("health", crashed(r, crash_text("mindspore_allreduce_kernel.txt"), world=n,
                                   since=T0 + 60)) for r in others(n, culprit)]  # fmt: skip
    kill = [("health", health(culprit, RankState.LOST, world=n, since=T0 + 71))]
    changes = deliver(t, timeouts + kill, seed=seed, passes=2, now=T0 + 200)
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("hang", (culprit,), others(n, culprit))
    assert inc.terminated == () and not [c for c in changes if c.change != "opened"]
    # the culprit's stall and loss, then the peers' stalls and their timeouts: an item each
    peers = ranges(list(others(n, culprit))) if n > 2 else ()
    assert [(e.rank, e.count) for e in inc.timeline[:2]] == [(culprit, 1), (culprit, 1)]
    assert [(e.what, e.count, e.ranks) for e in inc.timeline[2:]] == [
        ("stalled at step 19", n - 1, peers),
        ("crashed: RuntimeError: Launch kernel failed, name:.../AllReduce-op2", n - 1, peers),
    ]


@pytest.mark.parametrize("n", [2, 4, 4096])
def test_hang_without_stacks_peers_failing_name_the_one_they_waited_for(n: int) -> None:
    culprit = n // 2
    t = IncidentTracker()
    deliver(t, world(n))
    deliver(t, [("health", crashed(r, crash_text("torch_gloo_timeout.txt"), world=n,
                                   since=T0 + 30)) for r in others(n, culprit)])  # fmt: skip
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("hang", (culprit,), others(n, culprit))
    assert inc.basis == "its peers failed in collectives waiting for it" and inc.step == 19
    t.observe(T0 + 200, health=[health(culprit, RankState.LOST, world=n, since=T0 + 41)])
    assert only(t).culprits == (culprit,) and only(t).terminated == ()


def test_a_rank_that_went_silent_before_the_timeouts_is_lost_not_hung() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, health=[health(1, RankState.LOST, since=T0 + 10)])
    t.observe(T0 + 101, health=[crashed(r, crash_text("mindspore_gloo_peer_closed.txt"),
                                        since=T0 + 30) for r in (0, 2, 3)])  # fmt: skip
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("lost", (1,), (0, 2, 3))


@pytest.mark.parametrize(
    ("progress", "culprits", "basis"),
    [
        ({0: 5.0, 1: 5.0, 2: 1.0, 3: 5.0}, (2,), "least progress (no stacks)"),
        ({0: 5.0, 1: 5.0, 2: 5.0, 3: 5.0}, (0, 1, 2, 3), "every rank stopped at the same step"),
    ],
)
def test_hang_without_stacks_falls_back_on_progress(
    progress: dict[int, float], culprits: tuple[int, ...], basis: str
) -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, health=[health(r, RankState.STALLED, since=T0 + 35, progress=T0 + p)
                                for r, p in progress.items()])  # fmt: skip
    inc = only(t)
    assert inc.cause == "hang" and inc.culprits == culprits and inc.basis.startswith(basis)


@pytest.mark.parametrize("recovered", [True, False])
def test_old_stacks_do_not_name_a_culprit(recovered: bool) -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 10, health=[health(3, RankState.STALLED, since=T0 + 10)],
              stacks=[stack(3, "sleep", IN_SLEEP, time=T0 + 10)]
              + [stack(r, "framework", IN_ALLREDUCE, time=T0 + 10) for r in range(3)])  # fmt: skip
    if recovered:
        t.observe(T0 + 20, health=[health(3, step=20)])
    # much later every rank stalls at step 50, no new samples; rank 1 made the least progress
    stalls = [
        health(r, RankState.STALLED, step=50, since=T0 + 1000, progress=T0 + 900 + 50 * (r != 1))
        for r in range(4)
    ]
    t.observe(T0 + 1000, health=stalls)
    last = t.incidents(RUN)[-1]
    assert last.culprits == (1,) and last.basis == "least progress (no stacks)"


def test_stacks_that_single_no_one_out_leave_the_fallback() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(
        T0 + 100,
        health=[health(r, RankState.STALLED, progress=T0 + (1 if r == 3 else 5)) for r in range(4)],
        stacks=[stack(r, "framework", IN_ALLREDUCE) for r in range(4)],
    )
    assert only(t).culprits == (3,) and only(t).basis == "least progress (no stacks)"


# --- lost, divergence, slow ------------------------------------------------------------------


def test_one_rank_lost_then_back() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    opened = t.observe(T0 + 100, health=[health(3, RankState.LOST, since=T0 + 12)])
    assert opened[0].incident.cause == "lost" and opened[0].incident.culprits == (3,)
    back = t.observe(T0 + 130, health=[health(3)])
    assert [c.change for c in back] == ["resolved"] and back[0].incident.resolved == T0 + 130
    assert t.open_count(RUN) == 0 and t.incidents(RUN)[0].state == "resolved"


def test_many_ranks_lost_in_one_burst_are_one_incident() -> None:
    t = IncidentTracker()
    deliver(t, world(64))
    t.observe(T0 + 100, health=[health(r, RankState.LOST, world=64, since=T0 + 12 + r / 64)
                                for r in range(32, 64)])  # fmt: skip
    inc = only(t)
    assert inc.cause == "lost" and inc.culprits == tuple(range(32, 64))


@pytest.mark.parametrize("n", [4, 64])
def test_every_rank_silent_at_once_names_no_single_culprit(n: int) -> None:
    t = IncidentTracker()
    deliver(t, world(n))
    t.observe(T0 + 100, health=[health(r, RankState.LOST, world=n, since=T0 + 12 + r / n)
                                for r in range(n)])  # fmt: skip
    inc = only(t)
    assert inc.cause == "lost" and len(inc.culprits) == n
    assert inc.basis == "every rank went silent at once: no single culprit"
    assert inc.summary.startswith(f"every rank ({n}) went silent at once: the job stopped")
    # half of them is still a loss with culprits (a switch, a node)
    t2 = IncidentTracker()
    deliver(t2, world(n))
    t2.observe(T0 + 100, health=[health(r, RankState.LOST, world=n, since=T0 + 12)
                                 for r in range(n // 2)])  # fmt: skip
    assert only(t2).basis == "went silent first"


@pytest.mark.parametrize(("kind", "cause"), [("outlier", "divergence"), ("straggler", "slow")])
def test_one_rank_off_while_the_others_agree(kind: str, cause: str) -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, divergences=[outlier(2, 22, kind=kind)])
    t.observe(T0 + 101, divergences=[outlier(2, 23, "grad_norm", kind=kind)])
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected, inc.step) == (cause, (2,), (), 22)
    t.observe(T0 + 120, resolved=[outlier(2, 40, kind=kind)])
    assert t.open_count(RUN) == 1  # grad_norm still off
    done = t.observe(T0 + 121, resolved=[outlier(2, 41, "grad_norm", kind=kind)])
    assert [c.change for c in done] == ["resolved"]


# --- several faults, noise -------------------------------------------------------------------


def test_second_independent_faults_open_second_incidents() -> None:
    t = IncidentTracker()
    deliver(t, world(16))
    # NaN from rank 2 reaching its data-parallel group 0-7
    t.observe(T0 + 100, divergences=[nan(2, 20)] + [nan(r, 21) for r in others(8, 2)])
    # a different error on a rank outside the incident, within the window: a second fault
    c2 = t.observe(
        T0 + 101, health=[crashed(12, "ValueError: bad shard", world=16, since=T0 + 101)]
    )
    # a NaN on another rank 380 steps later is not propagation, even within the window
    c3 = t.observe(T0 + 102, divergences=[nan(13, 400, "grad_norm")])
    # nor is one on an affected rank once the window has passed
    c4 = t.observe(T0 + 300, divergences=[nan(5, 2000, "lr")])
    assert [i.id for i in t.incidents(RUN)] == [f"{RUN}#{k}" for k in range(1, 5)]
    assert [c.change for c in c2 + c3 + c4] == ["opened"] * 3
    assert [(c.incident.cause, c.incident.culprits) for c in c2 + c3 + c4] == [
        ("crash", (12,)),
        ("nonfinite", (13,)),
        ("nonfinite", (5,)),
    ]
    assert t.incidents(RUN)[0].culprits == (2,) and t.incidents(RUN)[0].affected == others(8, 2)


def test_crash_of_an_affected_rank_after_the_nan_stays_in_its_incident() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, divergences=[nan(2, 20)] + [nan(r, 21) for r in others(4, 2)])
    assert t.observe(T0 + 101, health=[crashed(1, "ValueError: loss is nan", since=T0 + 101)]) == []
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("nonfinite", (2,), (0, 1, 3))


def test_divergence_beside_a_crash_is_its_own_incident() -> None:
    t = IncidentTracker()
    deliver(t, world(8))
    t.observe(T0 + 100, health=[crashed(1, "RuntimeError: CUDA error: an illegal memory access")])
    t.observe(T0 + 101, divergences=[outlier(6, 30)])
    assert [(i.cause, i.culprits) for i in t.incidents(RUN)] == [
        ("crash", (1,)),
        ("divergence", (6,)),
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_healthy_rank_recovering_does_not_blur_the_culprit(seed: int) -> None:
    n, culprit, noisy = 64, 40, 7
    t = IncidentTracker()
    deliver(t, world(n))
    blip = t.observe(T0 + 50, health=[health(noisy, RankState.STALLED, world=n, since=T0 + 45)])
    assert blip[0].incident.culprits == (noisy,)
    items = [("health", health(noisy, world=n, step=20))]  # the noisy rank steps again
    items += [("divergences", nan(culprit, 20))]
    items += [("divergences", nan(r, 21)) for r in others(n, culprit)]
    deliver(t, items, seed=seed, passes=3, now=T0 + 60)
    first, second = t.incidents(RUN)
    assert first.state == "resolved" and first.culprits == (noisy,)
    assert (second.cause, second.culprits, second.state) == ("nonfinite", (culprit,), "firing")


def test_timeline_starts_with_the_culprit_and_holds_a_burst_as_one_item() -> None:
    t = IncidentTracker(IncidentConfig(timeline_max=10))
    deliver(t, world(4096))
    t.observe(T0 + 100, divergences=[nan(r, 21) for r in others(4096, 77)] + [nan(77, 20)])
    inc = only(t)
    assert inc.evidence_count == 4096
    culprit, peers = inc.timeline  # the 4,095 alike but for their rank: one item
    what = "loss non-finite"
    assert (culprit.rank, culprit.step, culprit.what, culprit.count) == (77, 20, what, 1)
    assert (peers.rank, peers.step, peers.what, peers.count) == (0, 21, what, 4095)
    assert peers.ranks == ((0, 76), (78, 4095)) and culprit.ranks == ()
    assert inc.as_dict()["timeline"][1]["ranks"] == [[0, 76], [78, 4095]]
    assert inc.summary == "rank 77 (node-9, pid 1077) went non-finite first (loss at step 20); " \
        "4095 ranks followed from step 21"  # fmt: skip
    assert inc.as_dict()["culprits"] == [77]


def test_stacks_from_a_rank_the_run_never_reported_are_refused() -> None:
    t = IncidentTracker()
    deliver(t, world(4))
    t.observe(T0 + 100, stacks=[stack(99, "user", IN_SLEEP), stack(1, "user", IN_SLEEP)])
    assert t.refused_stacks == 1 and [s.rank for s in t.stacks(RUN)] == [1]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"window_s": 0}, "window_s"),
        ({"window_s": float("inf")}, "window_s"),
        ({"spread_steps": -1}, "spread_steps"),
        ({"timeline_max": 0}, "timeline_max"),
    ],
)
def test_bad_config_is_refused_by_name(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IncidentConfig(**kw)


def test_open_incidents_and_evidence_are_bounded_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rankwatch.aggregator.incidents import tracker as module

    monkeypatch.setattr(module, "OPEN_MAX", 3)
    monkeypatch.setattr(module, "EVIDENCE_MAX", 5)
    t = IncidentTracker()
    deliver(t, world(16))
    for k, rank in enumerate((1, 2, 3, 4)):  # four unrelated stragglers: four incidents
        t.observe(T0 + 100 + k, divergences=[outlier(rank, 10 + k, kind="straggler")])
    assert t.evicted == 1 and t.open_count(RUN) == 3
    assert [i.culprits for i in t.incidents(RUN)] == [(1,), (2,), (3,), (4,)]
    t.observe(T0 + 200, divergences=[nan(r, 50) for r in range(8)])
    inc = t.incidents(RUN)[-1]
    assert inc.evidence_count == 5 and t.dropped_evidence == 3


def test_the_rest_of_a_burst_of_another_kind_is_held_as_its_own_kind() -> None:
    # The culprit's stall comes first in the burst, then every peer's collective failure: the
    # failures go to the incident in one go, and must count as failures, not as stalls.
    n, culprit = 64, 32
    t = IncidentTracker()
    deliver(t, world(n))
    gloo = crash_text("torch_gloo_timeout.txt")
    t.observe(T0 + 100, health=[crashed(0, gloo, world=n, since=T0 + 30)])
    stall = health(culprit, RankState.STALLED, world=n, since=T0 + 31)
    peers = [crashed(r, gloo, world=n, since=T0 + 32) for r in others(n, culprit) if r]
    t.observe(T0 + 101, health=[stall, *peers])
    inc = only(t)
    assert (inc.cause, inc.culprits, inc.affected) == ("hang", (culprit,), others(n, culprit))
    assert inc.basis == "its peers failed in collectives waiting for it"
