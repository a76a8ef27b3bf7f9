"""Where the training thread is while a rank does not step: compact stack samples, and the
``faulthandler`` watchdog for when no Python thread can run.

The agent's background thread calls ``StallSampler.maybe_sample`` on its own schedule. It reads
the main thread's frames with ``sys._current_frames()`` (no signal, nothing runs on the training
thread) only once the rank has gone ``factor`` times its usual step time without a step, and at
most once per ``interval_s``. When the main thread holds the interpreter lock inside C code the
background thread does not run at all; the next sample says how long it was held off, and
``FaultWatchdog`` (a C thread that needs no lock) writes every thread's stack to
``rank<k>.stacks.txt`` beside the rank's JSONL. ``parse_faulthandler`` reads that file back.

Standard library only: this runs inside every training process. The sample's wire form is
``agent/wire/stacks.py``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import linecache
import math
import re
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from rankwatch.agent.wire.stacks import (
    FILE_MAX,
    FUNC_MAX,
    MAX_FRAMES,
    Frame,
    StackSample,
    clip,
    clip_tail,
)

WALK_MAX = 64  # frames looked at to classify a stack (a deep recursion is not walked through)
SIGNATURE_HEX = 16  # hex digits of a signature
STALL_FACTOR = 3.0  # a rank is sampled after this many usual step times without a step
MIN_STALL_S = 5.0  # ... and never before this many seconds
SAMPLE_INTERVAL_S = 5.0  # at most one sample per this many seconds while stalled
HELD_OFF_MARGIN_S = 2.0  # a call this much later than its period means the thread was held off
WATCHDOG_TIMEOUT_S = 300.0  # no step for this long: faulthandler dumps every thread's stack
PARSE_MAX_DUMPS = 8  # dumps kept when reading a stacks file (the latest ones)
PARSE_MAX_BYTES = 4 << 20  # bytes read from the end of a stacks file

# Packages whose frames are "the framework": their collectives, graph execution, kernels.
FRAMEWORKS = ("mindspore", "torch", "hccl", "nccl", "deepspeed", "megatron", "apex", "horovod",
              "jax", "tensorflow", "mindformers", "torch_npu", "accelerate")  # fmt: skip
# Paths of data loaders inside those packages (waiting for a batch is not a collective).
DATALOADERS = ("torch/utils/data/", "mindspore/dataset/", "torchdata/", "tensorflow/python/data/")
_PACKAGE_ROOTS = ("site-packages/", "dist-packages/")
_STDLIB = tuple(
    {
        str(Path(p).resolve()) + "/"
        for key in ("stdlib", "platstdlib")
        if (p := sysconfig.get_path(key))
    }
)
_SLEEP = re.compile(r"\bsleep\s*\(")

__all__ = [
    "FaultWatchdog", "Frame", "StackSample", "StallSampler", "ThreadStack", "parse_faulthandler",
    "sample_of_dump", "stacks_path", "summarise",
]  # fmt: skip


def summarise(
    frame: FrameType | None,
    max_frames: int = MAX_FRAMES,
    source: Callable[[str, int], str] = linecache.getline,
) -> StackSample:
    """A frame stack (innermost ``frame``, e.g. ``sys._current_frames()[tid]``) in compact form.

    ``source(file, line)`` gives a frame's source line, to tell a ``time.sleep`` (a C call, no
    frame of its own) from other waits.
    """
    raw = list(_walk(frame, WALK_MAX))
    frames = tuple(Frame(_short(f), line, clip(fn, FUNC_MAX)) for f, line, fn in raw[:max_frames])
    return StackSample(_where(raw, source), _signature(frames), frames)


class StallSampler:
    """Samples one thread's stack while its rank does not step; at most one per interval."""

    def __init__(
        self,
        thread_id: int,
        *,
        period_s: float,
        factor: float = STALL_FACTOR,
        min_stall_s: float = MIN_STALL_S,
        interval_s: float = SAMPLE_INTERVAL_S,
        held_off_margin_s: float = HELD_OFF_MARGIN_S,
        max_frames: int = MAX_FRAMES,
        frames: Callable[[], dict[int, FrameType]] = sys._current_frames,
        source: Callable[[str, int], str] = linecache.getline,
    ) -> None:
        for name, value in (("period_s", period_s), ("factor", factor),
                            ("min_stall_s", min_stall_s), ("interval_s", interval_s),
                            ("held_off_margin_s", held_off_margin_s)):  # fmt: skip
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"StallSampler {name} must be a positive number, got {value!r}")
        self.thread_id = thread_id
        self.period_s = period_s
        self.factor = factor
        self.min_stall_s = min_stall_s
        self.interval_s = interval_s
        self.held_off_margin_s = held_off_margin_s
        self.max_frames = max_frames
        self._frames = frames
        self._source = source
        self._last_call: float | None = None
        self._last_sample: float | None = None
        self._held_off = 0.0  # the longest hold-off not yet reported
        self.samples = 0

    def maybe_sample(
        self, now: float, last_step_time: float | None, median_step_s: float | None,
        step: int | None = None,
    ) -> StackSample | None:  # fmt: skip
        """A sample when the rank has gone too long without a step (all times on one clock,
        seconds), else None."""
        if self._last_call is not None:
            late = now - self._last_call - self.period_s
            if late > self.held_off_margin_s:
                self._held_off = max(self._held_off, late + self.period_s)
        self._last_call = now
        if last_step_time is None:
            return None
        stalled = now - last_step_time
        usual = median_step_s if median_step_s is not None and median_step_s > 0 else 0.0
        if stalled < max(self.min_stall_s, self.factor * usual):
            self._last_sample = None
            return None
        if self._last_sample is not None and now - self._last_sample < self.interval_s:
            return None
        frame = self._frames().get(self.thread_id)
        base = summarise(frame, self.max_frames, self._source)
        note = ""
        if self._held_off:
            note = (
                f"sampler held off {self._held_off:.0f} s "
                "(the main thread held the interpreter lock)"
            )
            self._held_off = 0.0
        self._last_sample = now
        self.samples += 1
        return StackSample(
            base.where, base.signature, base.frames, step, now, round(stalled, 3), note
        )


def stacks_path(jsonl: Path) -> Path:
    """``.../rank3.jsonl`` -> ``.../rank3.stacks.txt``."""
    return jsonl.with_name(f"{jsonl.stem}.stacks.txt")


class FaultWatchdog:
    """``faulthandler.dump_traceback_later`` into the rank's stacks file, pushed back by
    ``progress()`` (the background thread calls it when the step advanced). One per process:
    faulthandler has one such timer."""

    def __init__(self, path: Path, timeout_s: float = WATCHDOG_TIMEOUT_S) -> None:
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"watchdog timeout must be a positive number, got {timeout_s!r}")
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._arm()

    def progress(self) -> None:
        if self._file is not None:
            faulthandler.cancel_dump_traceback_later()
            self._arm()

    def close(self) -> None:
        """Disarm; a stacks file nothing was written to goes (a rank that never hung leaves
        only its JSONL behind)."""
        if self._file is not None:
            faulthandler.cancel_dump_traceback_later()
            self._file.close()
            self._file = None
            with contextlib.suppress(OSError):
                if self.path.stat().st_size == 0:
                    self.path.unlink()

    def _arm(self) -> None:
        assert self._file is not None
        faulthandler.dump_traceback_later(self.timeout_s, repeat=True, file=self._file)

    def __enter__(self) -> FaultWatchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    current: bool  # the thread that wrote the dump ("Current thread")
    frames: tuple[Frame, ...]  # innermost first (faulthandler's order)
    truncated: bool = False  # faulthandler stopped at its frame limit ("...")
    dump: int = 0  # which dump of the file, counting from 0 among those kept


_DUMP_HEAD = re.compile(r"^Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!$")
_THREAD_HEAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[[^\]]*\])? \(most recent call first\):$"
)
_FILE_LINE = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str, max_dumps: int = PARSE_MAX_DUMPS) -> list[ThreadStack]:
    """Every thread of the last ``max_dumps`` dumps of a faulthandler file; lines it does not
    know are skipped (a torn last write, other output in the file)."""
    text = text[-PARSE_MAX_BYTES:]
    threads: list[ThreadStack] = []
    dump = -1
    head: tuple[int, bool] | None = None
    frames: list[Frame] = []
    truncated = False

    def flush() -> None:
        if head is not None:
            threads.append(ThreadStack(head[0], head[1], tuple(frames), truncated, max(dump, 0)))

    for line in text.splitlines():
        if _DUMP_HEAD.match(line):
            flush()
            head, frames, truncated, dump = None, [], False, dump + 1
        elif m := _THREAD_HEAD.match(line):
            flush()
            head, frames, truncated = (
                (int(m.group(2), 16), m.group(1) == "Current thread"),
                [],
                False,
            )
        elif head is not None and (m := _FILE_LINE.match(line)):
            if len(frames) < WALK_MAX:
                frames.append(
                    Frame(_short(m.group(1)), int(m.group(2)), clip(m.group(3), FUNC_MAX))
                )
            else:
                truncated = True
        elif head is not None and line.strip() == "...":
            truncated = True
    flush()
    last = max((t.dump for t in threads), default=0)
    return [t for t in threads if t.dump > last - max_dumps]


def sample_of_dump(
    threads: list[ThreadStack], time: float = 0.0, step: int | None = None
) -> StackSample | None:
    """The main thread of the last dump in ``threads`` (``parse_faulthandler``) as a sample, or
    None when there is none. faulthandler lists the newest thread first, so the main thread is
    the last of its dump. File names are already short here: the standard library is told by
    its ``python3.X/`` folder, and a sleep cannot be told from other user code (no source)."""
    if not threads:
        return None
    last = max(t.dump for t in threads)
    main = [t for t in threads if t.dump == last][-1]
    frames = main.frames[:MAX_FRAMES]
    own = [f for f in main.frames if not _STDLIB_SHORT.match(f.file)]
    where = "unknown" if not main.frames else "user"
    if own:
        if any(d in own[0].file for d in DATALOADERS):
            where = "dataloader"
        elif _owner(own[0].file) is not None:
            where = "framework"
    note = f"faulthandler dump {last + 1} of the stacks file" + (" (cut)" if main.truncated else "")
    return StackSample(where, _signature(frames), frames, step, time, 0.0, note)


_STDLIB_SHORT = re.compile(r"^(<frozen|python3\.\d+/|lib/python3)")


# --- internals ------------------------------------------------------------------------------


def _walk(frame: FrameType | None, limit: int) -> Iterator[tuple[str, int, str]]:
    n = 0
    # another thread's frames are read while it may be unwinding them: stop at anything that
    # is not a frame rather than fail the sample
    while isinstance(frame, FrameType) and n < limit:
        code = frame.f_code
        yield code.co_filename, frame.f_lineno or 0, getattr(code, "co_qualname", code.co_name)
        frame = frame.f_back
        n += 1


def _where(raw: list[tuple[str, int, str]], source: Callable[[str, int], str]) -> str:
    own = [(f, line) for f, line, _ in raw if not _is_stdlib(f)]
    if not own:
        return "unknown" if not raw else "user"
    first_file, first_line = own[0]
    path = _norm(first_file)
    if any(d in path for d in DATALOADERS):
        return "dataloader"
    if _owner(path) is not None:
        return "framework"
    # time.sleep is a C call: no frame of its own, so read the line that called it
    if len(own) == len(raw) or raw[0][0] == first_file:
        try:
            if _SLEEP.search(source(first_file, first_line) or ""):
                return "sleep"
        except Exception:  # a source reader that fails says nothing about the stack
            pass
    return "user"


def _is_stdlib(file: str) -> bool:
    if file.startswith("<frozen"):
        return True
    path = _norm(file)
    return any(path.startswith(p) for p in _STDLIB) and not any(r in path for r in _PACKAGE_ROOTS)


def _norm(file: str) -> str:
    return file.replace("\\", "/")


def _owner(path: str) -> str | None:
    """The framework package a path belongs to, if any (by a path component)."""
    for part in path.split("/")[:-1]:
        if part in FRAMEWORKS:
            return part
    return None


def _short(file: str) -> str:
    path = _norm(file)
    for root in _PACKAGE_ROOTS:
        at = path.rfind(root)
        if at >= 0:
            return _clip_path(path[at + len(root) :])
    parts = path.split("/")
    owner = _owner(path)
    if owner is not None:
        return _clip_path("/".join(parts[parts.index(owner) :]))
    return _clip_path("/".join(parts[-2:]))


def _clip_path(path: str) -> str:
    return clip_tail(path, FILE_MAX)


def _signature(frames: tuple[Frame, ...]) -> str:
    h = hashlib.blake2b(digest_size=SIGNATURE_HEX // 2)
    for f in frames:
        h.update(f"{f.file}\0{f.function}\n".encode("utf-8", "replace"))
    return h.hexdigest()
