"""The real 4-rank msrun job, one fault on rank 2 per test: the incident must name rank 2 alone.

Each test runs demo/train_mindspore.py under msrun with a real `rankwatch serve`, polls
``/api/run/incidents`` while the job runs (keeping when each incident was first seen) and, once
the job is over and the ranks' states have settled, checks the run's incidents: one incident for
the fault, rank 2 its only culprit with the injected fault's cause, the other ranks affected,
terminated or untouched as the fault implies, and the fault step in its timeline.

One msrun job per fault, not one per question asked of it: the NaN incident is checked on
test_actions_msrun's job (its policy then stops the job), and the crash and labels jobs also
carry the checks of the ranks' states, their JSONL files and the store:

- crash: rank 2 shows crashed (with its message), the ranks msrun then SIGKILLs show lost, and
  nothing the ranks wrote is missing from the store;
- labels: the aggregator flags rank 2, and only rank 2, within 5 steps; every rank logs every
  step and ends with an ``end`` event; every rank's JSONL equals what the store holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.wire import records

from .conftest import (
    FlagWatcher,
    Serve,
    assert_store_matches_jsonl,
    events_by_rank,
    launch_env,
    lost_after_config,
    read_jsonl,
    require_msrun,
    run_launcher,
)
from .test_msrun_e2e import RANKS, msrun_command

pytestmark = [pytest.mark.msrun, pytest.mark.mindspore, pytest.mark.timeout(300)]

FAULT_RANK = 2
FAULT_STEP = 12
LOST_AFTER_S = 5.0  # serve's silence limit before a rank counts as lost
# The ranks' heartbeat interval: a killed rank counts as lost after max(LOST_AFTER_S, two
# heartbeats + 2 s), 6 s rather than the 12 s of the default 5 s heartbeat.
HEARTBEAT_S = 2.0
WITHIN_STEPS = 5  # a divergent rank must be flagged by step FAULT_STEP + WITHIN_STEPS
OTHERS = tuple(r for r in range(RANKS) if r != FAULT_RANK)
CAUSE_WORDS = {"nonfinite": "non-finite", "divergence": "diverged", "hang": "hung",
               "crash": "crashed", "slow": "slow"}  # fmt: skip


@dataclass
class IncidentWatcher:
    """Polls the run's incidents in a thread; keeps each one's first sighting (wall time)."""

    serve: Serve
    run: str
    interval_s: float = 0.25
    first_seen: dict[str, float] = field(default_factory=dict)
    first_form: dict[str, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> IncidentWatcher:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.incidents()

    def incidents(self) -> list[dict[str, Any]]:
        got = self.serve.get(f"/api/run/incidents?run={self.run}") or {}
        now = time.time()
        found = list(got.get("incidents") or [])
        for inc in found:
            if inc["id"] not in self.first_seen:
                self.first_seen[inc["id"]] = now
                self.first_form[inc["id"]] = inc
        return sorted(found, key=lambda inc: int(inc["id"].rsplit("#", 1)[1]))


@dataclass
class Job:
    run: str
    code: int
    incidents: list[dict[str, Any]]
    watcher: IncidentWatcher
    steps: dict[int, dict[int, float]]  # rank -> step -> record time
    states: dict[int, dict[str, Any]]
    log: Path
    console: list[str]  # serve's [INCIDENT] / [UPDATED] / [RESOLVED] lines of this run
    serve: Serve
    log_dir: Path  # the ranks' RANKWATCH_LOG_DIR
    flags: FlagWatcher | None = None

    def step_time(self, rank: int, step: int) -> float:
        return self.steps[rank][step]

    def describe(self) -> str:
        lines = [f"launcher exit {self.code}; log {self.log}"]
        lines += [f"  rank {r}: {row.get('state')} {row.get('message')!r:.200}"
                  for r, row in sorted(self.states.items())]  # fmt: skip
        for inc in self.incidents:
            lines.append(
                f"  {inc['id']} {inc['cause']} culprits={inc['culprits']} "
                f"affected={inc['affected']} terminated={inc['terminated']} step={inc['step']} "
                f"basis={inc['basis']!r} summary={inc['summary']!r}"
            )
            lines += [f"    {e['step']} r{e['rank']} {e['what'][:120]}" for e in inc["timeline"]]
        lines += [f"  console: {line[:200]}" for line in self.console]
        return "\n".join(lines)


def watch_job(
    serve: Serve,
    run: str,
    cmd: list[str],
    env: dict[str, str],
    tmp_path: Path,
    settled: Any,
    *,
    ranks: int = RANKS,
    settle_s: float = 40.0,
    watch_flags: bool = False,
) -> Job:
    """Run the launcher ``cmd`` to its end while watching incidents (and, with ``watch_flags``,
    every divergence's first sighting); then wait until ``settled(incidents, states)`` holds
    (or ``settle_s`` passed) and return what serve says."""
    log = tmp_path / "launcher.log"
    flags = FlagWatcher(serve, run) if watch_flags else None
    with IncidentWatcher(serve, run) as watcher, flags or contextlib.nullcontext():
        # serve may still be starting (see run_fault): the ranks' sockets reconnect by themselves
        code = run_launcher(cmd, env, log, 240.0, meanwhile=serve.wait_ready)
        incidents: list[dict[str, Any]] = []
        states: dict[int, dict[str, Any]] = {}

        def done() -> bool:
            nonlocal incidents, states
            incidents, states = watcher.incidents(), serve.rank_states(run)
            return len(states) == ranks and bool(settled(incidents, states))

        deadline = time.monotonic() + settle_s
        while not done() and time.monotonic() < deadline:
            time.sleep(0.5)
    times: dict[int, dict[int, float]] = {}
    for rank, recs in read_jsonl(Path(env["RANKWATCH_LOG_DIR"]) / run).items():
        times[rank] = {r.step: r.time for r in recs if isinstance(r, records.StepRecord)}
    console = announced(serve, run, len(incidents))
    log_dir = Path(env["RANKWATCH_LOG_DIR"])
    job = Job(run, code, incidents, watcher, times, states, log, console, serve, log_dir, flags)
    (tmp_path / "seen.json").write_text(json.dumps({"states": states, "incidents": incidents}))
    print(job.describe())
    return job


def announced(serve: Serve, run: str, incidents: int, wait_s: float = 10.0) -> list[str]:
    """serve's console lines about ``run``, once it has told each of its ``incidents`` opened.

    The API has an incident the moment it opens; its console line waits until the culprit and
    cause were quiet for a second (``AnnounceHold``), so a job that ends fast is settled
    before the line is printed."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = [
            line.split(" rankwatch ", 1)[-1]
            for line in serve.log.read_text(errors="replace").splitlines()
            if f"] {run}: " in line
            and any(w in line for w in ("[INCIDENT]", "[UPDATED]", "[RESOLVED]"))
        ]
        told = sum(line.startswith("[INCIDENT]") for line in lines)
        if told >= incidents or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def run_fault(
    serve_factory: Any,
    tmp_path: Path,
    fault: str,
    *,
    steps: int,
    node_timeout_s: int,
    settled: Any,
    extra: tuple[str, ...] = (),
    lost_after_s: float | None = LOST_AFTER_S,
    watch_flags: bool = False,
) -> Job:
    """Run msrun with ``fault`` on rank 2 from FAULT_STEP and watch it (``watch_job``); serve
    counts a rank lost after ``lost_after_s`` of silence (None: its default)."""
    msrun = require_msrun()
    config = tmp_path / "serve.toml"
    lost: list[str] = [] if lost_after_s is None else lost_after_config(config, lost_after_s)
    # The launcher starts while serve does: both import for seconds before they do anything.
    serve: Serve = serve_factory(extra=lost, wait=False)
    run = f"e2e-incident-{fault}-{os.getpid()}"
    env = launch_env(
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=serve.ingest_addr,
        RANKWATCH_LOG_DIR=str(tmp_path / "jsonl"),
        MS_NODE_TIMEOUT=str(node_timeout_s),
        RANKWATCH_HEARTBEAT_S=str(HEARTBEAT_S),
    )
    cmd = msrun_command(
        msrun, tmp_path, "--steps", str(steps), "--fault", fault,
        "--fault-rank", str(FAULT_RANK), "--fault-step", str(FAULT_STEP),
        "--step-sleep", "0.05", *extra,
    )  # fmt: skip
    return watch_job(serve, run, cmd, env, tmp_path, settled, watch_flags=watch_flags)


def assert_one_incident(job: Job, cause: str, fault_time: float) -> dict[str, Any]:
    """The one incident opened from the fault on; before it only startup silences may show.

    On a busy 2-core machine a rank compiling its graph can send nothing for longer than the
    short lost limit these tests use; that opens a `lost` incident that resolves when the rank
    reports again, before the fault: it is not the fault's."""
    before = [inc for inc in job.incidents if inc["opened"] < fault_time]
    after = [inc for inc in job.incidents if inc["opened"] >= fault_time]
    for inc in before:
        assert inc["cause"] == "lost" and inc["state"] == "resolved", job.describe()
    if before:
        print(f"startup silences before the fault: {[inc['culprits'] for inc in before]}")
    assert len(after) == 1, job.describe()
    inc = after[0]
    assert inc["culprits"] == [FAULT_RANK], job.describe()
    assert inc["cause"] == cause, job.describe()
    assert FAULT_RANK not in inc["affected"] + inc["terminated"], job.describe()
    # The console said it once when it opened, with the culprit and cause, and never changed
    # its mind (an [UPDATED] line means the culprit or the cause changed).
    word = CAUSE_WORDS[cause]
    opened = [
        line
        for line in job.console
        if line.startswith(f"[INCIDENT] {job.run}: rank {FAULT_RANK} {word}:")
    ]
    assert len(opened) == 1, job.describe()
    assert not [line for line in job.console if line.startswith("[UPDATED]")], job.describe()
    return inc


def culprit_steps(inc: dict[str, Any]) -> set[int]:
    return {e["step"] for e in inc["timeline"] if e["rank"] == FAULT_RANK and e["step"]}


def open_delay(job: Job, inc: dict[str, Any], fault_time: float) -> float:
    delay = job.watcher.first_seen[inc["id"]] - fault_time
    first = job.watcher.first_form[inc["id"]]
    print(
        f"{inc['id']}: first seen {delay:.1f} s after the fault step, as cause {first['cause']}"
        f" culprits {first['culprits']}; at the end cause {inc['cause']} culprits {inc['culprits']}"
        f" affected {inc['affected']} terminated {inc['terminated']}"
    )
    return delay


def every_rank_down(incidents: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> bool:
    return bool(incidents) and all(row["state"] != "alive" for row in states.values())


def test_crash_names_the_raising_rank(serve_factory: Any, tmp_path: Path) -> None:
    def settled(incidents: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> bool:
        if not every_rank_down(incidents, states):
            return False
        inc = incidents[-1]
        if not set(inc["affected"] + inc["terminated"]) >= set(OTHERS):
            return False
        return states[FAULT_RANK]["state"] == "crashed" and all(
            states[r]["state"] == "lost" for r in OTHERS
        )

    job = run_fault(serve_factory, tmp_path, "crash", steps=200, node_timeout_s=5, settled=settled)
    assert job.code != 0, job.describe()  # msrun fails when a rank raises
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP - 1)
    inc = assert_one_incident(job, "crash", fault_time)
    assert set(inc["affected"] + inc["terminated"]) == set(OTHERS), job.describe()
    assert FAULT_STEP - 1 in culprit_steps(inc), job.describe()  # the last step it finished
    open_delay(job, inc, fault_time)

    # The raising rank shows crashed with its message; the ranks msrun SIGKILLed show lost.
    states = job.states
    assert states[FAULT_RANK]["state"] == "crashed", job.describe()
    assert "injected fault" in (states[FAULT_RANK].get("message") or ""), states[FAULT_RANK]
    assert all(states[r]["state"] == "lost" for r in OTHERS), job.describe()
    entry = job.serve.run_entry(job.run) or {}
    assert entry.get("state") in ("crashed", "lost"), entry.get("state")

    jsonl = read_jsonl(job.log_dir / job.run)
    assert sorted(jsonl) == list(range(RANKS))
    crashes = events_by_rank(jsonl, "crash")
    assert [len(crashes[r]) for r in range(RANKS)] == [int(r == FAULT_RANK) for r in range(RANKS)]
    info = crashes[FAULT_RANK][0].info
    assert "RuntimeError" in info["exc_type"] and "injected fault" in info["message"]
    last_steps = {
        rank: max((r.step for r in recs if isinstance(r, records.StepRecord)), default=0)
        for rank, recs in jsonl.items()
    }
    assert last_steps[FAULT_RANK] == FAULT_STEP - 1
    ends = events_by_rank(jsonl, "end")
    assert not any(ends.values()), f"SIGKILLed ranks cannot say goodbye: {ends}"

    job.serve.stop()
    assert_store_matches_jsonl(job.serve.data, job.run, jsonl)


def every_rank_finished(incidents: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> bool:
    return bool(incidents) and all(row["state"] == "finished" for row in states.values())


def test_hang_names_the_sleeping_rank(serve_factory: Any, tmp_path: Path) -> None:
    def settled(incidents: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> bool:
        if not every_rank_down(incidents, states):
            return False
        inc = incidents[-1]
        # The snapshot calls a silent rank lost before the tracker's next pass hears of it.
        return set(inc["affected"] + inc["terminated"]) >= set(OTHERS) and bool(culprit_steps(inc))

    job = run_fault(serve_factory, tmp_path, "hang", steps=200, node_timeout_s=5, settled=settled)
    assert job.code != 0, job.describe()
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP - 1)
    inc = assert_one_incident(job, "hang", fault_time)
    assert set(inc["affected"] + inc["terminated"]) == set(OTHERS), job.describe()
    assert FAULT_STEP - 1 in culprit_steps(inc), job.describe()
    hung = [line for line in job.console if line.startswith("[INCIDENT]")]
    assert f"hung after step {FAULT_STEP - 1} " in hung[0], job.describe()  # as first said
    open_delay(job, inc, fault_time)


def test_labels_names_the_divergent_rank(serve_factory: Any, tmp_path: Path) -> None:
    steps = 20
    # serve's default lost limit: a startup silence must not raise an alert on a healthy rank
    job = run_fault(
        serve_factory, tmp_path, "labels", steps=steps, node_timeout_s=30,
        settled=every_rank_finished, lost_after_s=None, watch_flags=True,
    )  # fmt: skip
    assert job.code == 0, job.describe()
    assert all(row["state"] == "finished" for row in job.states.values()), job.describe()
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP)
    inc = assert_one_incident(job, "divergence", fault_time)
    assert inc["affected"] == [] and inc["terminated"] == [], job.describe()
    assert FAULT_STEP in culprit_steps(inc), job.describe()
    open_delay(job, inc, fault_time)

    # Only the bad rank is flagged, and soon after the fault.
    assert job.flags is not None
    first = job.flags.first
    assert job.flags.flagged_ranks() == {FAULT_RANK}, first
    reported = [d["step"] for (rank, _, _), d in first.items() if rank == FAULT_RANK]
    assert min(reported) <= FAULT_STEP + WITHIN_STEPS, first
    assert all(d["since_step"] >= FAULT_STEP for d in first.values()), first
    alerts = job.serve.get(f"/api/alerts?run={job.run}") or {}
    alerted = {a.get("rank") for a in [*alerts.get("firing", []), *alerts.get("history", [])]}
    assert alerted - {None} <= {FAULT_RANK}, alerts

    # Every rank wrote its whole run and ended cleanly.
    jsonl = read_jsonl(job.log_dir / job.run)
    assert sorted(jsonl) == list(range(RANKS))
    for rank, recs in jsonl.items():
        logged = [r for r in recs if isinstance(r, records.StepRecord)]
        assert [r.step for r in logged] == list(range(1, steps + 1)), f"rank {rank}: {logged[:5]}"
        assert all({"loss", "grad_norm_local"} <= set(r.metrics) for r in logged)
    ends = events_by_rank(jsonl, "end")
    assert all(len(ends[rank]) == 1 for rank in range(RANKS)), ends

    # What the store holds is exactly what the ranks wrote.
    job.serve.stop()
    assert_store_matches_jsonl(job.serve.data, job.run, jsonl)


def test_slow_names_the_straggler(serve_factory: Any, tmp_path: Path) -> None:
    job = run_fault(
        serve_factory, tmp_path, "slow", steps=20, node_timeout_s=30, settled=every_rank_finished,
        extra=("--slow-s", "0.5"),
    )  # fmt: skip
    assert job.code == 0, job.describe()
    fault_time = job.step_time(FAULT_RANK, FAULT_STEP)
    inc = assert_one_incident(job, "slow", fault_time)
    assert inc["affected"] == [] and inc["terminated"] == [], job.describe()
    assert min(culprit_steps(inc)) in (FAULT_STEP, FAULT_STEP + 1), job.describe()
    open_delay(job, inc, fault_time)
