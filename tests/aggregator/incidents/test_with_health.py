"""The tracker fed the way the service would: records -> the real HealthTracker -> changes() and
stack samples in the agent's wire form -> IncidentTracker, one pass per tick. No sleeps: the
clock is the loop's ``now``."""

from __future__ import annotations

import pytest
from rankwatch.agent.stacks import Frame, StackSample
from rankwatch.agent.wire.records import EventRecord, Heartbeat, StepRecord
from rankwatch.aggregator.health import HealthChanges, HealthTracker
from rankwatch.aggregator.incidents.stacks import StackSample as WireSample
from rankwatch.aggregator.incidents.tracker import IncidentTracker

from tests.aggregator.incidents.builders import crash_text

RUN, N, T = "msrun4", 4, 1_700_000_000.0
PEER_FAILURE = crash_text("mindspore_allreduce_kernel.txt").split("RuntimeError: ", 1)[1]
IN_COLLECTIVE = (Frame("mindspore/common/api.py", 1891, "_exec_pip"),
                 Frame("mindspore/train/model.py", 940, "_train_process"))  # fmt: skip
IN_CALLBACK = (Frame("job/train_mindspore.py", 99, "step_begin"),
               Frame("mindspore/train/model.py", 930, "_train_process"))  # fmt: skip


class Job:
    """Four ranks as the agent reports them, one tick per second of job time."""

    def __init__(self) -> None:
        self.health = HealthTracker()
        self.incidents = IncidentTracker()
        self.items = IncidentTracker()  # fed the same items as a plain list: read per value
        self.seq = {r: 0 for r in range(N)}
        self.changes: list = []

    def _seq(self, rank: int) -> int:
        self.seq[rank] += 1
        return self.seq[rank]

    def step(self, rank: int, step: int, t: float) -> None:
        rec = StepRecord(RUN, rank, self._seq(rank), T + t, N, f"node{rank}", 100 + rank, step,
                         None, {"loss": 2.0})  # fmt: skip
        self.health.observe(rec, T + t)

    def heartbeat(self, rank: int, last_step: int, t: float) -> None:
        self.health.observe(Heartbeat(RUN, rank, self._seq(rank), T + t, last_step, 5.0, 0), T + t)

    def event(self, rank: int, kind: str, step: int, t: float, **info: object) -> None:
        rec = EventRecord(RUN, rank, self._seq(rank), T + t, N, f"node{rank}", 100 + rank, kind,
                          step, info)  # fmt: skip
        self.health.observe(rec, T + t)

    def tick(self, t: float, stacks: list[WireSample] = ()) -> None:
        now = T + t
        changed = self.health.changes(now)
        assert isinstance(changed, HealthChanges) and changed.in_step()
        new = self.incidents.observe(now, health=changed, stacks=stacks)
        assert self.items.observe(now, health=list(changed), stacks=stacks) == new
        assert self.items.incidents(RUN) == self.incidents.incidents(RUN)
        self.changes += new

    def only(self):
        (inc,) = self.incidents.incidents(RUN)
        return inc


def run_until_step_19(job: Job) -> None:
    for t in range(20):
        for r in range(N):
            job.step(r, t, float(t))
        job.tick(float(t))


@pytest.mark.parametrize("with_stacks", [False, True])
def test_msrun_hang_rank_2_sleeps_peers_time_out_in_allreduce(with_stacks: bool) -> None:
    job = Job()
    run_until_step_19(job)
    stalled_seen = None
    for t in range(20, 80):
        alive = [0, 1, 3] if t < 60 else []  # the peers' collective times out at 60 s
        beating = [*alive, 2] if t <= 61 else alive  # msrun kills rank 2 at 61 s
        for r in beating:
            job.heartbeat(r, 19, float(t))
        if t == 60:
            for r in (0, 1, 3):
                job.event(r, "crash", 19, 60.0, exc_type="builtins.RuntimeError",
                          message=PEER_FAILURE)  # fmt: skip
        stacks = []
        if with_stacks and t >= 40:  # the agents sample once the ranks have stalled
            for r in range(N):
                frames = IN_CALLBACK if r == 2 else IN_COLLECTIVE
                where = "sleep" if r == 2 else "framework"
                sample = StackSample(where, f"sig{where}", frames, 19, T + t, t - 19.0)
                stacks.append(WireSample.from_dict(RUN, r, sample.as_dict()))
        job.tick(float(t), stacks)
        if stalled_seen is None and job.incidents.incidents(RUN):
            stalled_seen = t
    inc = job.only()
    assert (inc.cause, inc.culprits, inc.affected, inc.terminated) == ("hang", (2,), (0, 1, 3), ())
    assert inc.step == 19
    opened = [c for c in job.changes if c.change == "opened"]
    assert len(opened) == 1
    if with_stacks:  # named while every rank was still only stalled, before the timeouts
        assert opened[0].incident.culprits == (2,) and stalled_seen < 60
        assert inc.basis.startswith("stacks: 3 ranks (0, 1, 3) in mindspore/")
        assert not [c for c in job.changes if c.change == "updated"]
    else:
        assert inc.basis == "its peers failed in collectives waiting for it"
    assert "RuntimeError: Launch kernel failed, name:.../AllReduce-op2" in {
        e.what.removeprefix("crashed: ") for e in inc.timeline
    }


def test_msrun_crash_rank_1_raises_peers_fail_launcher_terminates() -> None:
    job = Job()
    run_until_step_19(job)
    job.event(1, "crash", 20, 20.5, exc_type="builtins.RuntimeError",
              message="injected fault: rank 1 crashed at step 20")  # fmt: skip
    job.tick(20.5)
    for r in (0, 2):
        job.event(r, "crash", 20, 50.0, exc_type="builtins.RuntimeError", message=PEER_FAILURE)
    job.event(3, "end", 20, 50.5, reason="SIGTERM")
    job.tick(51.0)
    inc = job.only()
    assert (inc.cause, inc.culprits, inc.affected, inc.terminated) == ("crash", (1,), (0, 2), (3,))
    assert inc.summary.startswith("rank 1 (node1, pid 101) crashed first (RuntimeError: injected")
    assert [c.change for c in job.changes] == ["opened"]


def test_changes_columns_are_its_items_and_read_the_same_as_them() -> None:
    job = Job()
    run_until_step_19(job)
    for t in range(20, 51):  # rank 3 falls silent: lost; the others stall
        for r in (0, 1, 2):
            job.heartbeat(r, 19, float(t))
    job.event(0, "crash", 19, 50.5, exc_type="builtins.RuntimeError", message="bad batch")
    job.event(1, "crash", 19, 50.6, exc_type="builtins.RuntimeError", message=PEER_FAILURE)
    changed = job.health.changes(T + 51.0)
    assert len({h.state for h, _ in changed}) == 3  # crashed, stalled, lost in one burst
    assert changed.ranks == [h.rank for h, _ in changed] == [0, 1, 2, 3]
    assert changed.states == [h.state for h, _ in changed] and changed.runs == [RUN]
    new = job.incidents.observe(T + 51.0, health=changed)
    assert job.items.observe(T + 51.0, health=list(changed)) == new
    assert job.items.incidents(RUN) == job.incidents.incidents(RUN)
    assert ("crash", (0,)) in {(i.cause, i.culprits) for i in job.incidents.incidents(RUN)}
    changed.append(changed[0])  # extended past ``add``: its columns no longer say it all
    assert not changed.in_step()
