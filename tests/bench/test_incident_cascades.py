"""Faults that spread, from the load generator: the schedule (pure), and one run of 1,024
simulated ranks over ZeroMQ into a real ``rankwatch serve`` whose incident must name the hung
rank alone. ``bench/incident_cascades.py`` runs many seeds of every scenario."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from incident_cascades import SCENARIOS, draw, judge, run_one, wait_http
from loadgen import Fault, Model, parse_faults
from loadgen_cascade import KILL_AFTER_S, STACK_AFTER_S, Cascade, Noise, exception_of
from serve_proc import ServeProc

CRASHES = Path(__file__).resolve().parents[1] / "fixtures" / "crashes"


def test_nanspread_reaches_every_rank_one_step_later() -> None:
    model = Model(16, 5.0, 1, [Fault("nanspread", 5, None, 10)])
    assert not any(math.isnan(x) for x in model.values(9)["loss"])
    assert [r for r, x in enumerate(model.values(10)["loss"]) if math.isnan(x)] == [5]
    assert all(math.isnan(x) for x in model.values(11)["loss"])


def test_a_hang_stops_every_rank_then_the_peers_fail_then_the_culprit_is_killed() -> None:
    rate, onset, wait = 5.0, 10, 3.0
    c = Cascade(8, rate, 3, [Fault("hangwait", 2, wait, onset)], Noise(spread_s=1.0))
    assert c.stepping(onset - 1) and not c.stepping(onset)
    assert c.stack(0, onset, 0.0) is None  # not stalled long enough to be sampled
    later = onset + round(STACK_AFTER_S * rate)
    culprit, peer = c.stack(2, later, 1.0), c.stack(0, later, 1.0)
    assert culprit is not None and peer is not None
    assert (culprit["where"], peer["where"]) == ("dataloader", "framework")
    assert culprit["signature"] != peer["signature"] and peer["step"] == onset - 1
    ticks = {r: t for t, at in c.events.items() for r in at}
    peers = [ticks[r] for r in range(8) if r != 2]
    assert min(peers) >= onset + wait * rate and max(peers) <= onset + (wait + 1.0) * rate
    assert ticks[2] == max(peers) + round(KILL_AFTER_S * rate)
    assert c.event(2, ticks[2]) == ("end", onset - 1, {"reason": "SIGTERM"})
    kind, step, info = c.event(0, ticks[0]) or ("", None, {})
    assert (kind, step, info["exc_type"]) == ("crash", onset - 1, "builtins.RuntimeError")


def test_a_crash_comes_at_the_onset_and_the_peers_later() -> None:
    c = Cascade(4, 5.0, 0, [Fault("crashwait", 1, 2.0, 10)], Noise())
    assert c.event(1, 10) == (
        "crash", 9, {"exc_type": "builtins.ValueError",
                     "message": "label 7 out of range for 5 classes", "fatal": True},
    )  # fmt: skip
    assert all(c.event(r, 10) is None for r in (0, 2, 3))


@pytest.mark.parametrize(
    ("name", "exc"),
    [
        ("user_valueerror.txt", "builtins.ValueError"),
        ("torch_cuda_oom.txt", "torch.OutOfMemoryError"),
        ("torch_nccl_watchdog.txt", "torch.distributed.DistBackendError"),
        ("msrun_demo_hang_peer_allreduce.txt", "builtins.RuntimeError"),
    ],
)
def test_crash_texts_become_the_agents_crash_fields(name: str, exc: str) -> None:
    kind, message = exception_of((CRASHES / name).read_text())
    assert kind == exc and message and not message.startswith("Traceback")


def test_cascade_faults_parse_and_refuse_a_wait_of_zero() -> None:
    assert parse_faults("hangwait:3:5@12", 8, 10) == [Fault("hangwait", 3, 5.0, 12)]
    assert parse_faults("crashwait:3", 8, 10) == [Fault("crashwait", 3, 4.0, 10)]
    with pytest.raises(ValueError, match="wait must be > 0"):
        parse_faults("hangwait:3:0", 8, 10)


def test_draws_are_seeded_and_judged_strictly() -> None:
    assert draw("hang", 4, 1024) == draw("hang", 4, 1024)
    assert len({draw("nan", s, 1024).culprit for s in range(8)}) > 4
    d = draw("crash", 0, 16)
    inc = {"cause": "crash", "culprits": [d.culprit], "summary": "", "basis": "", "state": "",
           "timeline": [],
           "affected": [r for r in range(16) if r != d.culprit], "terminated": []}  # fmt: skip
    assert judge([inc], d.culprit, "crash", 16) == ""
    assert judge([inc], (d.culprit + 1) % 16, "crash", 16) != ""  # another culprit
    assert judge([inc, inc], d.culprit, "crash", 16) != ""  # a second incident
    assert judge([dict(inc, cause="hang")], d.culprit, "crash", 16) != ""
    assert judge([dict(inc, affected=inc["affected"][1:])], d.culprit, "crash", 16) != ""


@pytest.mark.timeout(240)
def test_a_hang_at_1024_ranks_through_a_real_serve_names_the_hung_rank() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServeProc(Path(tmp) / "data", ["--min-stall-s", "3"]) as head,
    ):
        wait_http(head)
        wrong, _, _ = run_one(head, "hang", 0, 1024, 2, "process")
    if wrong.startswith("void"):
        pytest.skip(wrong)  # the machine starved the load generator: the run proves nothing
    assert wrong == "", wrong
    assert SCENARIOS["hang"] == ("hangwait", "hang")
