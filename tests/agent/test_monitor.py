"""Monitor in this process: what log(), event(), pause() and close() write (JSONL only)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankwatch.agent import Monitor
from rankwatch.agent.monitor import CLOSE_TIMEOUT_S
from rankwatch.agent.wire import records


def read_jsonl(path: Path) -> list[records.Record]:
    return [records.from_json_line(line) for line in path.read_text().splitlines()]


def steps_of(recs: list[records.Record]) -> list[records.StepRecord]:
    return [r for r in recs if isinstance(r, records.StepRecord)]


def events_of(recs: list[records.Record], kind: str | None = None) -> list[records.EventRecord]:
    events = [r for r in recs if isinstance(r, records.EventRecord)]
    return [e for e in events if kind is None or e.event == kind]


VALUES: list[tuple[str, Any, float]] = [
    ("plain", 0.5, 0.5),
    ("int", 3, 3.0),
    ("bool", True, 1.0),
    ("nan", math.nan, math.nan),
    ("inf", math.inf, math.inf),
    ("ninf", -math.inf, -math.inf),
    ("negzero", -0.0, -0.0),
    ("tiny", 5e-324, 5e-324),
    ("huge", 1.7976931348623157e308, 1.7976931348623157e308),
    ("exp", 1e16, 1e16),
    ("np32", np.float32(0.1), float(np.float32(0.1))),
    ("npint", np.int64(-7), -7.0),
    ("np0d", np.array(np.nan), math.nan),
    ("unicode é/ü", 1.25, 1.25),
    ('quote"back\\slash', 2.0, 2.0),
    ("ctrl\nchar", 3.0, 3.0),
    ("100%s %d %r", 4.0, 4.0),  # names reach a %-template
]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1, a) == math.copysign(1, b)
    )


def test_every_line_decodes_to_the_logged_values(make_monitor: Any) -> None:
    mon = make_monitor()
    for step in range(1, 4):
        mon.log(step, epoch=step // 2, **{name: value for name, value, _ in VALUES})
    mon.close()
    recs = read_jsonl(mon.jsonl_path)
    steps = steps_of(recs)
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.epoch for s in steps] == [0, 1, 1]
    for rec in steps:
        assert (rec.run, rec.rank, rec.world_size, rec.pid) == ("test-run", 0, 1, mon.pid)
        for name, _, expected in VALUES:
            assert same(rec.metrics[name], expected), name
    # The hot path's hand-made lines parse as strict RFC 8259 JSON.
    for line in mon.jsonl_path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard constant {c}"))


@pytest.mark.parametrize(
    "sequence",
    [
        [{"a": 1.0}, {"a": 2.0}, {"a": math.nan}, {"a": 3}, {"a": 4.0}],  # fast, slow, fast
        [{"a": 1.0, "b": 2.0}, {"b": 2.0, "a": 1.0}, {"a": 1.0}, {}, {"a": "x", "b": 1.0}],
        [{"a": 1.0, "": 2.0}, {"a": 1.0, "": 2.0}, {"%": 1.0}, {"%": 1.0}],
    ],
)
def test_template_cache_agrees_with_the_slow_path(
    make_monitor: Any, sequence: list[dict[str, Any]]
) -> None:
    mon = make_monitor()
    for step, metrics in enumerate(sequence):
        mon.log(step, **metrics)
    mon.close()
    logged = steps_of(read_jsonl(mon.jsonl_path))
    assert len(logged) == len(sequence)
    for rec, metrics in zip(logged, sequence, strict=True):
        want = {k: float(v) for k, v in metrics.items() if k and not isinstance(v, str)}
        got = {k: v for k, v in rec.metrics.items() if k not in ("step_time", "throughput")}
        assert list(got) == list(want)
        assert all(same(got[k], want[k]) for k in want)


def test_seq_increases_across_kinds_from_one(make_monitor: Any) -> None:
    mon = make_monitor()
    mon.log(1, loss=1.0)
    mon.event("eval", step=1, accuracy=0.5)
    mon.log(2, loss=0.9)
    mon.close()
    recs = read_jsonl(mon.jsonl_path)
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    assert [getattr(r, "event", r.kind) for r in recs] == ["start", "step", "eval", "step", "end"]


def test_restart_continues_seq_and_keeps_the_old_records(make_monitor: Any) -> None:
    first = make_monitor()
    first.log(1, loss=1.0)
    first.close()
    second = make_monitor()
    assert second.jsonl_path == first.jsonl_path
    second.log(2, loss=0.5)
    second.close()
    recs = read_jsonl(first.jsonl_path)
    seqs = [r.seq for r in recs]
    assert seqs == list(range(1, 7))  # start step end start step end, no seq twice
    assert [s.step for s in steps_of(recs)] == [1, 2]


def test_start_event_carries_launcher_info(
    make_monitor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    mon = make_monitor()
    mon.close()
    start = events_of(read_jsonl(mon.jsonl_path), "start")[0]
    assert start.info["launcher"] == "msrun"
    assert start.info["env"] == {"RANK_ID": "1", "RANK_SIZE": "2"}
    assert start.info["pid"] == mon.pid and start.rank == 1 and start.world_size == 2
    assert start.info["python"].count(".") == 2


def test_step_time_and_throughput(make_monitor: Any) -> None:
    mon = make_monitor(batch_size=32)
    mon.log(10, loss=1.0)
    time.sleep(0.05)
    mon.log(12, loss=1.0)
    mon.log(12, eval_loss=2.0)  # the same step again: no new step time
    mon.batch_size = None
    time.sleep(0.02)
    mon.log(13, loss=1.0, step_time=9.0)  # an explicit step_time wins
    mon.log(14, loss=1.0)
    mon.log(3, loss=1.0)  # counting restarted (a new train() call)
    mon.close()
    steps = steps_of(read_jsonl(mon.jsonl_path))
    assert "step_time" not in steps[0].metrics
    st = steps[1].metrics["step_time"]
    assert 0.02 <= st <= 0.2  # 50 ms over 2 steps
    assert steps[1].metrics["throughput"] == pytest.approx(32 / st)
    assert "step_time" not in steps[2].metrics
    assert steps[3].metrics["step_time"] == 9.0 and "throughput" not in steps[3].metrics
    assert "throughput" not in steps[4].metrics and "step_time" in steps[4].metrics
    assert "step_time" not in steps[5].metrics


@pytest.mark.parametrize(
    ("value", "expected"),
    [(32, 32.0), (np.int64(8), 8.0), (None, None), ("lots", None), (0, None), (-4, None)],
)
def test_batch_size_is_checked(make_monitor: Any, value: Any, expected: float | None) -> None:
    mon = make_monitor(batch_size=value)
    assert mon.batch_size == expected
    mon.batch_size = 16
    assert mon.batch_size == 16.0


@pytest.mark.parametrize(
    "metrics",
    [
        {"s": "0.5"},
        {"n": None},
        {"l": [1.0, 2.0]},
        {"d": {"a": 1}},
        {"o": object()},
        {"c": 1j},
        {"big": 10**400},
        {"a": np.ones(3)},
        {"": 1.0},
        {"x" * 100_000: 1.0},
        {"\ud800": 1.0},
    ],
)
def test_bad_metrics_are_skipped_never_raised(make_monitor: Any, metrics: dict[str, Any]) -> None:
    mon = make_monitor()
    mon.log(1, good=1.0, **metrics)
    mon.close()
    (rec,) = steps_of(read_jsonl(mon.jsonl_path))
    assert dict(rec.metrics) == {"good": 1.0}


@pytest.mark.parametrize(
    ("step", "epoch", "logged"),
    [
        (np.int64(5), None, (5, None)),
        (5.0, np.int32(2), (5, 2)),
        (7, "x", (7, None)),
        ("abc", None, None),
        (None, None, None),
        (1.5, None, None),
        (True, None, None),
        (2**70, None, None),
        (math.nan, None, None),
    ],
)
def test_odd_steps_and_epochs(
    make_monitor: Any, step: Any, epoch: Any, logged: tuple[int, int | None] | None
) -> None:
    mon = make_monitor()
    mon.log(step, epoch, loss=1.0)
    mon.close()
    steps = steps_of(read_jsonl(mon.jsonl_path))
    assert [(s.step, s.epoch) for s in steps] == ([] if logged is None else [logged])


def test_each_bad_name_is_warned_once(make_monitor: Any, caplog: pytest.LogCaptureFixture) -> None:
    mon = make_monitor()
    with caplog.at_level(logging.WARNING, "rankwatch.agent"):
        for step in range(100):
            mon.log(step, loss="high", acc=None, ok=1.0)
    mon.close()
    messages = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(messages) == 2
    assert any("'loss'" in m and "str 'high'" in m for m in messages)


def test_too_many_metrics_are_cut(make_monitor: Any) -> None:
    mon = make_monitor()
    mon.log(1, **{f"m{i}": float(i) for i in range(5000)})
    mon.close()
    (rec,) = steps_of(read_jsonl(mon.jsonl_path))
    assert len(rec.metrics) <= records.MAX_METRICS


def test_stage_adds_to_the_next_log(make_monitor: Any) -> None:
    mon = make_monitor()
    mon.stage(grad_norm_local=np.float32(2.0), loss=9.0)
    mon.log(1, loss=1.0)
    mon.log(2, loss=1.0)
    mon.close()
    first, second = steps_of(read_jsonl(mon.jsonl_path))
    assert first.metrics["grad_norm_local"] == 2.0 and first.metrics["loss"] == 1.0
    assert "grad_norm_local" not in second.metrics


def test_events(make_monitor: Any) -> None:
    mon = make_monitor()
    mon.event("eval", step=np.int64(4), accuracy=np.float32(0.5), bad=math.nan, tags=["a"])
    mon.event("reboot", reason="x")  # not an event kind: kept as a note
    mon.event("note", step="x", text="hi")
    mon.close()
    ev = {e.event: e for e in events_of(read_jsonl(mon.jsonl_path))}
    assert ev["eval"].step == 4
    assert ev["eval"].info == {"accuracy": 0.5, "bad": "NaN", "tags": ["a"]}
    notes = events_of(read_jsonl(mon.jsonl_path), "note")
    assert notes[0].info == {"kind": "reboot", "reason": "x"}
    assert notes[1].step is None


def test_pause_and_resume(make_monitor: Any) -> None:
    mon = make_monitor()
    mon.log(1, loss=1.0)
    with mon.pause(300, "checkpoint"):
        pass
    mon.log(2, loss=1.0)
    mon.pause(0)  # not a duration: 60 s
    mon.resume()
    mon.resume()  # not paused: nothing
    mon.close()
    recs = read_jsonl(mon.jsonl_path)
    kinds = [e.event for e in events_of(recs)]
    assert kinds == ["start", "pause", "resume", "pause", "resume", "end"]
    pause = events_of(recs, "pause")
    assert pause[0].info == {"seconds": 300.0, "reason": "checkpoint"} and pause[0].step == 1
    assert pause[1].info["seconds"] == 60.0
    assert "step_time" not in steps_of(recs)[1].metrics  # the pause is not a slow step


def test_close_is_idempotent_and_quiets_the_monitor(make_monitor: Any) -> None:
    mon = make_monitor()
    started = time.monotonic()
    mon.close("finished")
    mon.close()
    assert time.monotonic() - started < CLOSE_TIMEOUT_S
    mon.log(5, loss=1.0)
    mon.event("note")
    with mon.pause(5):
        pass
    ends = events_of(read_jsonl(mon.jsonl_path), "end")
    assert [e.info["reason"] for e in ends] == ["finished"]
    assert len(read_jsonl(mon.jsonl_path)) == 2


def test_context_manager(tmp_path: Path) -> None:
    with Monitor(run="cm", log_dir=tmp_path) as mon:
        mon.log(1, loss=1.0)
    with pytest.raises(RuntimeError), Monitor(run="cm2", log_dir=tmp_path) as failing:
        raise RuntimeError("bad batch")
    assert events_of(read_jsonl(mon.jsonl_path), "end")[0].info == {"reason": "normal"}
    recs = read_jsonl(failing.jsonl_path)
    assert events_of(recs, "crash")[0].info["message"] == "bad batch"
    assert events_of(recs, "end") == []  # no end event after a crash


@pytest.mark.parametrize(
    ("info", "ends"),
    [({"message": "x"}, []), ({"fatal": False}, ["normal"]), ({"fatal": True}, [])],
)
def test_no_end_event_after_a_fatal_crash_event(
    make_monitor: Any, info: dict[str, Any], ends: list[str]
) -> None:
    mon = make_monitor()
    mon.event("crash", step=3, **info)  # as framework adapters report a crash
    mon.close(reason="normal")
    assert [e.info["reason"] for e in events_of(read_jsonl(mon.jsonl_path), "end")] == ends


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (SystemExit(0), "normal"),
        (SystemExit(2), "exit"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
    ],
)
def test_context_manager_exit_reasons(tmp_path: Path, exc: BaseException, reason: str) -> None:
    with pytest.raises(type(exc)), Monitor(run="cm", log_dir=tmp_path) as mon:
        raise exc
    recs = read_jsonl(mon.jsonl_path)
    assert [e.info["reason"] for e in events_of(recs, "end")] == [reason]
    assert events_of(recs, "crash") == []


def test_disabled_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mon = Monitor(run="off", log_dir=tmp_path, enabled=False)
    mon.log(1, loss=1.0)
    mon.event("note")
    mon.pause(1).__exit__()
    mon.close()
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")  # msrun's scheduler runs the script too
    sched = Monitor(run="off", log_dir=tmp_path)
    sched.log(1, loss=1.0)
    sched.close()
    assert not sched.enabled and sched.write_errors == 0
    assert not (tmp_path / "off").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"addr": "host:port"}, "bad port"),
        ({"heartbeat_s": 0}, "heartbeat_s"),
        ({"heartbeat_s": "5"}, "heartbeat_s"),
        ({"queue_max": 0}, "queue_max"),
        ({"rank": 2, "world_size": 2}, "not below"),
        ({"run": ""}, "run name"),
    ],
)
def test_constructor_raises_value_error(
    kwargs: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        Monitor(log_dir=tmp_path, **kwargs)


def test_heartbeat_interval_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def interval() -> float:
        with Monitor(run="hb", log_dir=tmp_path) as mon:
            return mon.heartbeat_s

    assert interval() == 5.0
    monkeypatch.setenv("RANKWATCH_HEARTBEAT_S", "1.5")
    assert interval() == 1.5
    with Monitor(run="hb", log_dir=tmp_path, heartbeat_s=3) as mon:  # the argument wins
        assert mon.heartbeat_s == 3.0
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("RANKWATCH_HEARTBEAT_S", bad)
        with pytest.raises(ValueError, match=f"RANKWATCH_HEARTBEAT_S must be .*{bad!r}"):
            Monitor(run="hb", log_dir=tmp_path)


def test_jsonl_only_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankwatch.agent import monitor as monitor_module

    monkeypatch.setattr(monitor_module, "_said_jsonl_only", False)
    with caplog.at_level(logging.WARNING, "rankwatch.agent"):
        for i in range(3):
            Monitor(run=f"r{i}", log_dir=tmp_path).close()
    said = [r for r in caplog.records if "JSONL only" in r.getMessage()]
    assert len(said) == 1


def test_default_log_dir_and_derived_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("RANKWATCH_ADDR", "ipc://" + str(tmp_path / "nobody"))
    with Monitor() as mon:
        mon.log(1, loss=1.0)
    assert mon.jsonl_path.parent.parent == tmp_path / "rankwatch_logs"
    assert mon.jsonl_path.name == "rank0.jsonl"
    assert mon.addr == "ipc://" + str(tmp_path / "nobody")
    assert len(steps_of(read_jsonl(mon.jsonl_path))) == 1


def test_full_disk_keeps_training_going(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "full" / "rank0.jsonl"
    target.parent.mkdir()
    target.symlink_to("/dev/full")
    with caplog.at_level(logging.WARNING, "rankwatch.agent"):
        mon = Monitor(run="full", log_dir=tmp_path)
        for step in range(100):
            mon.log(step, loss=1.0)
        mon.close()
    assert mon.write_errors == 102  # start, 100 steps, end
    assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1


# --- in a child process: kill -9, crashes, signals, exit ------------------------------------

CHILD = """
import os, sys, threading, time
from rankwatch.agent import Monitor
mon = Monitor(run="child", log_dir="logs", addr=os.environ.get("AGG"), heartbeat_s=0.2)
"""


def child_records(tmp_path: Path) -> list[records.Record]:
    return read_jsonl(tmp_path / "logs" / "child" / "rank0.jsonl")


def test_kill_9_loses_nothing_already_logged(child: Any, tmp_path: Path) -> None:
    proc = child(
        CHILD
        + """
for step in range(1, 10**9):
    mon.log(step, loss=1.0 / step, acc=0.5, lr=1e-3, a=1.0, b=2.0, c=float("nan"))
    print(step, flush=True)
    time.sleep(0.0002)
"""
    )
    printed: list[int] = []
    assert proc.stdout is not None
    while len(printed) < 300:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "child ended"
        printed.append(int(line))
    proc.kill()
    rest, _ = proc.communicate(timeout=10)
    printed += [int(x) for x in rest.split()]
    raw = (tmp_path / "logs" / "child" / "rank0.jsonl").read_text()
    lines = raw.split("\n")
    complete, last = lines[:-1], lines[-1]  # ``last`` is "" or a cut line
    recs = [records.from_json_line(line) for line in complete]
    logged = {r.step for r in steps_of(recs)}
    assert set(printed) <= logged
    assert last == "" or not last.endswith("}")


def test_uncaught_exception_writes_and_sends_a_crash_event(
    child: Any, tmp_path: Path, router: Any
) -> None:
    proc = child(
        CHILD
        + """
mon.log(1, loss=1.0)
def inner():
    raise ValueError("loss exploded")
inner()
""",
        env={"AGG": router.addr},
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "ValueError: loss exploded" in err  # the default hook still prints it
    recs = child_records(tmp_path)
    (crash,) = events_of(recs, "crash")
    assert crash.info["exc_type"] == "builtins.ValueError"
    assert crash.info["message"] == "loss exploded"
    assert "inner()" in crash.info["traceback"] and crash.info["fatal"] is True
    assert crash.step == 1
    assert events_of(recs, "end") == []
    sent = router.wait_for(lambda rs: any(getattr(r, "event", "") == "crash" for r in rs))
    assert records.to_json_line(crash) in {records.to_json_line(r) for r in sent}


def test_sigterm_ends_with_an_end_event_and_dies_of_sigterm(
    child: Any, tmp_path: Path, router: Any
) -> None:
    proc = child(
        CHILD
        + """
for step in range(1, 10**9):
    mon.log(step, loss=1.0)
    print(step, flush=True)
    time.sleep(0.001)
""",
        env={"AGG": router.addr},
    )
    assert proc.stdout is not None
    while int(proc.stdout.readline() or "-1") < 20:
        assert proc.poll() is None
    proc.terminate()
    proc.communicate(timeout=10)
    assert proc.returncode == -15
    end = events_of(child_records(tmp_path), "end")
    assert [e.info["reason"] for e in end] == ["SIGTERM"]
    router.wait_for(lambda rs: any(getattr(r, "event", "") == "end" for r in rs))


@pytest.mark.parametrize(
    ("body", "returncode", "reason"),
    [
        ("mon.log(1, loss=1.0)\n", 0, "normal"),
        ("mon.log(1, loss=1.0)\nsys.exit(3)\n", 3, "normal"),
        (
            "mon.log(1, loss=1.0)\nraise KeyboardInterrupt\n",
            -2,
            "KeyboardInterrupt",
        ),  # dies of SIGINT
        ("mon.close('done')\nmon.close()\n", 0, "done"),
    ],
)
def test_exit_sends_one_end_event(
    child: Any, tmp_path: Path, body: str, returncode: int, reason: str
) -> None:
    proc = child(CHILD + body)
    proc.communicate(timeout=30)
    assert proc.returncode == returncode
    recs = child_records(tmp_path)
    assert [e.info["reason"] for e in events_of(recs, "end")] == [reason]
    assert events_of(recs, "crash") == []


def test_exception_in_another_thread_is_recorded_not_fatal(child: Any, tmp_path: Path) -> None:
    proc = child(
        CHILD
        + """
def loader():
    raise RuntimeError("worker died")
t = threading.Thread(target=loader, name="loader")
t.start(); t.join()
mon.log(2, loss=1.0)
"""
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "worker died" in err
    recs = child_records(tmp_path)
    (crash,) = events_of(recs, "crash")
    assert crash.info["thread"] == "loader" and crash.info["fatal"] is False
    assert [e.info["reason"] for e in events_of(recs, "end")] == ["normal"]
    assert [s.step for s in steps_of(recs)] == [2]


def test_a_handler_already_installed_for_sigterm_is_left_alone(child: Any, tmp_path: Path) -> None:
    proc = child(
        """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
"""
        + CHILD
        + """
print("ready", flush=True)
time.sleep(30)
"""
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.terminate()
    proc.communicate(timeout=10)
    assert proc.returncode == 7  # the program's own handler ran
    assert [e.info["reason"] for e in events_of(child_records(tmp_path), "end")] == ["normal"]


def test_a_forked_child_inherits_an_inert_monitor(child: Any, tmp_path: Path) -> None:
    proc = child(
        CHILD
        + """
mon.log(1, loss=1.0)
pid = os.fork()
if pid == 0:
    mon.log(99, loss=1.0)
    mon.close("child")
    os._exit(0)
os.waitpid(pid, 0)
mon.log(2, loss=1.0)
"""
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    recs = child_records(tmp_path)
    assert [s.step for s in steps_of(recs)] == [1, 2]
    assert [e.info["reason"] for e in events_of(recs, "end")] == ["normal"]
