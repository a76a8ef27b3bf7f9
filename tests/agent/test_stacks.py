"""Stack samples of real threads: a user's sleep, a framework's collective, odd names, the
faulthandler watchdog's file read back."""

from __future__ import annotations

import faulthandler
import importlib.util
import itertools
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from rankwatch.agent import stacks
from rankwatch.agent.stacks import (
    FILE_MAX,
    FUNC_MAX,
    MAX_FRAMES,
    FaultWatchdog,
    StallSampler,
    parse_faulthandler,
    stacks_path,
    summarise,
)
from rankwatch.aggregator.incidents.stacks import StackSample as WireSample

from tests.polling import wait_until

USER_CODE = """
import time

def on_train_step_begin(stop):
    while not stop.is_set():
        time.sleep(0.01)  # the hung rank
    return 1
"""
FRAMEWORK_CODE = """
import time

def all_reduce(stop, depth=0):
    if depth < 2:
        return all_reduce(stop, depth + 1)
    while not stop.is_set():
        time.sleep(0.01)
    return 1
"""
WAITING_CODE = """
def wait_for_batch(stop):
    stop.wait()  # blocks in threading.py: the stdlib frames are looked through
"""


def load(path: Path, source: str) -> ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"m{abs(hash(str(path)))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Blocked:
    """Real threads parked in a function until the test ends."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, fn, *args: object) -> int:
        ready = threading.Event()

        def run() -> None:
            ready.set()
            fn(self.stop, *args)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        ready.wait(5)
        self.threads.append(t)
        assert t.ident is not None
        return t.ident

    def frame(self, ident: int, function: str):
        """The thread's innermost frame once it has reached ``function``."""

        def inside():
            frame = sys._current_frames().get(ident)
            names, f = [], frame
            while f is not None:
                names.append(f.f_code.co_name)
                f = f.f_back
            return frame if function in names else None

        return wait_until(inside, 5, what=f"thread in {function}")


@pytest.fixture
def blocked() -> Iterator[Blocked]:
    b = Blocked()
    yield b
    b.stop.set()
    for t in b.threads:
        t.join(5)


def test_user_sleep_and_framework_collective_are_told_apart(
    tmp_path: Path, blocked: Blocked
) -> None:
    user = load(tmp_path / "job" / "train.py", USER_CODE)
    framework = load(tmp_path / "site-packages" / "mindspore" / "communication" / "comm.py",
                     FRAMEWORK_CODE)  # fmt: skip
    hung = blocked.start(user.on_train_step_begin)
    peers = [blocked.start(framework.all_reduce) for _ in range(3)]
    s_hung = summarise(blocked.frame(hung, "on_train_step_begin"))
    s_peers = [summarise(blocked.frame(p, "all_reduce")) for p in peers]
    assert s_hung.where == "sleep"
    assert s_hung.frames[0].file == "job/train.py" and s_hung.frames[0].line == 6
    assert s_hung.frames[0].function == "on_train_step_begin"
    for s in s_peers:
        assert s.where == "framework"
        assert s.frames[0].file == "mindspore/communication/comm.py"
        assert s.frames[0].function == "all_reduce"
    # grouping: the three peers share one signature, the hung rank has its own
    assert len({s.signature for s in s_peers}) == 1 and s_hung.signature != s_peers[0].signature
    assert len(s_hung.signature) == 16 and all(c in "0123456789abcdef" for c in s_hung.signature)


def test_framework_by_a_path_component_and_stdlib_waits_looked_through(
    tmp_path: Path, blocked: Blocked
) -> None:
    # not installed: a checkout of the framework somewhere under a folder named mindspore
    framework = load(tmp_path / "src" / "mindspore" / "ops" / "grad_reducer.py", WAITING_CODE)
    user = load(tmp_path / "job" / "loader.py", WAITING_CODE)
    in_fw = summarise(blocked.frame(blocked.start(framework.wait_for_batch), "wait_for_batch"))
    in_user = summarise(blocked.frame(blocked.start(user.wait_for_batch), "wait_for_batch"))
    assert in_fw.where == "framework" and in_fw.frames[0].file.endswith("threading.py")
    assert any(f.file == "mindspore/ops/grad_reducer.py" for f in in_fw.frames)
    assert in_user.where == "user"  # waiting on an Event is not a sleep


def test_data_loader_frames(tmp_path: Path, blocked: Blocked) -> None:
    loader = load(tmp_path / "site-packages" / "torch" / "utils" / "data" / "dataloader.py",
                  FRAMEWORK_CODE)  # fmt: skip
    s = summarise(blocked.frame(blocked.start(loader.all_reduce), "all_reduce"))
    assert s.where == "dataloader" and s.frames[0].file == "torch/utils/data/dataloader.py"


def test_odd_and_huge_names_are_bounded(tmp_path: Path, blocked: Blocked) -> None:
    name = "f" + "x" * 5000
    code = USER_CODE.replace("on_train_step_begin", name)
    folder = tmp_path / ("d\x1b[31m" + "y" * 200)
    module = load(folder / ("z" * 200 + ".py"), code)
    s = summarise(blocked.frame(blocked.start(getattr(module, name)), name))
    top = s.frames[0]
    assert len(top.file) <= FILE_MAX and top.file.startswith("…") and top.file.endswith(".py")
    assert len(top.function) <= FUNC_MAX and top.function.endswith("…")
    deep = summarise(sys._getframe(), max_frames=3)
    assert len(deep.frames) == 3
    assert all(f.file.isprintable() for f in s.frames)
    wire = WireSample.from_dict("job", 2, {**s.as_dict(), "time": 1.0})
    assert wire.frames[0].file == top.file and wire.where == "sleep"


def test_no_frame_is_unknown() -> None:
    s = summarise(None)
    assert (s.where, s.frames) == ("unknown", ())


@pytest.mark.parametrize(
    ("since_step", "median", "expect"),
    [
        (None, None, False),  # no step yet
        (4.0, None, False),  # under min_stall_s
        (6.0, None, True),
        (6.0, 2.5, False),  # 3 x 2.5 s usual step: not yet
        (8.0, 2.5, True),
    ],
)
def test_sampler_waits_for_a_real_stall(
    since_step: float | None, median: float | None, expect: bool, blocked: Blocked, tmp_path: Path
) -> None:
    user = load(tmp_path / "job" / "train.py", USER_CODE)
    ident = blocked.start(user.on_train_step_begin)
    blocked.frame(ident, "on_train_step_begin")
    sampler = StallSampler(ident, period_s=1.0)
    now = 100.0
    last = None if since_step is None else now - since_step
    got = sampler.maybe_sample(now, last, median, step=19)
    assert (got is not None) is expect
    if got is not None:
        assert got.step == 19 and got.stalled_s == since_step and got.where == "sleep"


def test_sampler_at_most_once_per_interval_and_says_when_held_off(
    blocked: Blocked, tmp_path: Path
) -> None:
    user = load(tmp_path / "job" / "train.py", USER_CODE)
    ident = blocked.start(user.on_train_step_begin)
    blocked.frame(ident, "on_train_step_begin")
    calls = []

    def frames():
        calls.append(1)
        return sys._current_frames()

    sampler = StallSampler(ident, period_s=1.0, interval_s=5.0, frames=frames)
    assert sampler.maybe_sample(10.0, 0.0, 0.1) is not None
    assert sampler.maybe_sample(11.0, 0.0, 0.1) is None  # within the interval
    assert len(calls) == 1  # and the frames were not even read
    late = sampler.maybe_sample(51.0, 0.0, 0.1)  # called 40 s late: it could not run
    assert late is not None and late.note.startswith("sampler held off 40 s")
    for now in range(52, 56):  # on time again, within the interval
        assert sampler.maybe_sample(float(now), 0.0, 0.1) is None
    assert sampler.maybe_sample(56.0, 0.0, 0.1).note == ""  # said once
    assert sampler.maybe_sample(57.0, 56.5, 0.1) is None  # stepped again
    assert sampler.samples == 3
    with pytest.raises(ValueError, match="period_s"):
        StallSampler(ident, period_s=0)


def test_faulthandler_dump_is_parsed_back(tmp_path: Path, blocked: Blocked) -> None:
    user = load(tmp_path / "job" / "train.py", USER_CODE)
    ident = blocked.start(user.on_train_step_begin)
    blocked.frame(ident, "on_train_step_begin")
    path = stacks_path(tmp_path / "run" / "rank3.jsonl")
    assert path.name == "rank3.stacks.txt"
    path.parent.mkdir()
    with open(path, "w") as f:  # the format the watchdog writes, made at once
        f.write("Timeout (0:05:00)!\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)
    threads = parse_faulthandler(path.read_text())
    mine = next(t for t in threads if t.thread_id == ident)
    assert mine.frames[0] == stacks.Frame("job/train.py", 6, "on_train_step_begin")
    assert sum(t.current for t in threads) == 1


def test_watchdog_writes_when_no_step_comes(tmp_path: Path) -> None:
    path = tmp_path / "rank0.stacks.txt"
    with FaultWatchdog(path, timeout_s=0.05) as dog:
        dog.progress()
        wait_until(lambda: path.read_text().count("Timeout (") >= 2, 10, what="two dumps")
    threads = parse_faulthandler(path.read_text(), max_dumps=1)
    assert threads and {t.dump for t in threads} == {max(t.dump for t in threads)}
    main = next(t for t in threads if t.thread_id == threading.main_thread().ident)
    assert any(f.function == "test_watchdog_writes_when_no_step_comes" for f in main.frames)
    with pytest.raises(ValueError, match="timeout"):
        FaultWatchdog(path, timeout_s=float("nan"))


def test_parser_skips_what_it_does_not_know() -> None:
    text = (
        "garbage\nTimeout (0:00:01)!\nThread 0x00007f00 (most recent call first):\n"
        '  File "/x/site-packages/torch/distributed/c10d.py", line 12 in all_reduce\n'
        "  ...\n\nnoise\nThread 0x1 [MainThread] (most recent call first):\n  <no Python frame>\n"
        '  File "/x/y.py", line 9'  # torn last write
    )
    a, b = parse_faulthandler(text)
    assert a.frames == (stacks.Frame("torch/distributed/c10d.py", 12, "all_reduce"),)
    assert a.truncated and b.thread_id == 1 and b.frames == ()
    assert parse_faulthandler("") == []


def test_sample_sizes_are_bounded() -> None:
    def recurse(n: int):
        return recurse(n - 1) if n else summarise(sys._getframe())

    s = recurse(200)
    assert len(s.frames) == MAX_FRAMES and s.where == "user"


def test_watchdog_writes_while_the_main_thread_holds_the_interpreter_lock(tmp_path: Path) -> None:
    # A backtracking regex runs in C without releasing the lock: Python threads (the agent's
    # sampler) cannot run, the watchdog's C thread can.
    path = tmp_path / "rank0.stacks.txt"
    ticks: list[float] = []
    notes: list[str] = []
    stop = threading.Event()
    main_id = threading.main_thread().ident
    assert main_id is not None
    sampler = StallSampler(
        main_id, period_s=0.005, min_stall_s=0.001, interval_s=0.001, held_off_margin_s=0.5
    )

    def background() -> None:  # the agent's sender thread, sampling a rank stalled for 10 s
        while not stop.is_set():
            now = time.monotonic()
            ticks.append(now)
            sample = sampler.maybe_sample(now, now - 10.0, 0.1)
            if sample is not None and sample.note:
                notes.append(sample.note)
            time.sleep(0.005)

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(ticks) > 3, 5, what="background ticks")
        with FaultWatchdog(path, timeout_s=0.1):
            # each extra "a" doubles the regex's time: grow it until one call holds the lock
            # well past the sampler's margin, whatever this machine's speed
            held, n = 0.0, 20
            while held < 1.0 and n < 32:
                n += 1
                start = time.monotonic()
                re.match(r"(a+)+$", "a" * n + "b")
                held = time.monotonic() - start
        wait_until(lambda: notes, 5, what="a sample saying the sampler was held off")
    finally:
        stop.set()  # a failed wait must not leave the thread sampling through later tests
        thread.join(5)
    during = [t for t in ticks if start <= t <= start + held]
    gaps = [b - a for a, b in itertools.pairwise([start, *during, start + held])]
    assert max(gaps) > held / 2  # the Python thread was held off for most of the call
    # ... and its first sample afterwards says so
    assert any(n.startswith("sampler held off") and "interpreter lock" in n for n in notes)
    threads = parse_faulthandler(path.read_text())
    main = [t for t in threads if t.thread_id == threading.main_thread().ident]
    assert main and any(f.function.startswith("test_watchdog_writes_while") for f in main[0].frames)
