"""``Monitor``: the framework-free per-rank agent.

``log()`` is the hot path. It converts the values, writes one JSONL line with one ``os.write``
and appends a compact tuple to a bounded deque that the sender thread turns into msgpack. The
constant part of the line (run, rank, host, ...) is serialised once; only seq, time, step,
epoch and metrics are formatted per call. ``repr(float)`` is valid JSON for finite floats and
non-finite ones are written as the strings of ``jsonsafe.NONFINITE_TO_JSON``, so every line
decodes with ``records.from_json_line``.

Nothing here raises into training after construction: bad values are skipped and logged once
per metric name (see ``values``), a full disk is counted, a full queue is counted in
``dropped`` and reported in heartbeats. Only the constructor raises ``ValueError``, for
arguments or launcher variables that make no sense.

Process hooks (``hooks``, installed once for all monitors): an uncaught exception records a
``crash`` event and closes, SIGTERM and exit close, a forked child inherits no monitor. No
``end`` event follows a ``crash`` event. Under ``msrun`` the scheduler process
(``MS_ROLE=MS_SCHED``) runs the training script too; a monitor made there is disabled.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import operator
import os
import secrets
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from . import hooks, identity
from .commands import Commands, Handler
from .fallback import JsonlWriter, jsonl_path
from .sender import STEP, Sender
from .sources import (
    CKPT_DIR_ENV,
    TELEMETRY_ENV,
    Context,
    Sampler,
    Source,
    Telemetry,
    parse_telemetry,
    resolve,
)
from .sources.emit import json_line, telemetry_wire
from .stacks import MIN_STALL_S, SAMPLE_INTERVAL_S
from .stall import StallWatch
from .stall import stack_dump_s as stack_dump_s_of
from .values import NotANumber, check_name, plain, to_float
from .wire.commands import ACCEPT_ENV, ACK_EVENT, Ack, parse_accept
from .wire.curve import CURVE_DIR_ENV, curve_keys
from .wire.jsonsafe import NONFINITE_TO_JSON
from .wire.records import BASE_VERSION, EVENT_KINDS, MAX_INC, MAX_METRICS

HEARTBEAT_ENV = "RANKWATCH_HEARTBEAT_S"
HEARTBEAT_S = 5.0  # default heartbeat interval, seconds

log = logging.getLogger("rankwatch.agent")

CLOSE_TIMEOUT_S = 1.5  # close() waits at most this long for the sender to flush
SAMPLER_CLOSE_S = 0.2  # and this long for a metric source's sample in progress
EVENT_SLACK = 1000  # events may exceed queue_max by this much: start/end/crash matter most
MAX_KEY_CACHE = 4096  # metric names whose JSON key is cached
MAX_TEMPLATES = 256  # sets of metric names whose line template is cached
MAX_WARNINGS = 1000  # distinct warn-once keys; beyond this, bad metrics are only skipped
TRACEBACK_CHARS = 8192  # tail of a crash traceback kept in the event

_NAN, _INF, _NINF = (json.dumps(NONFINITE_TO_JSON[k]) for k in ("nan", "inf", "-inf"))
_said_jsonl_only = False
_now = time.time
_write = os.write
_COMPACT = (",", ":")


def _nonfinite(v: float) -> str:
    return _NAN if v != v else (_INF if v > 0 else _NINF)


class _Pause:
    """What ``Monitor.pause`` returns: usable as ``with mon.pause(300):`` to resume on exit."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor

    def __enter__(self) -> _Pause:
        return self

    def __exit__(self, *exc: object) -> None:
        self._monitor.resume()


class Monitor:
    """One rank's agent; see ``docs/architecture.md`` and ``identity`` for the arguments.

    Attributes: ``run``, ``rank``, ``world_size``, ``addr`` (ZeroMQ endpoint or None),
    ``incarnation`` (the ``inc`` of its records: its JSONL file's, or new), ``jsonl_path``,
    ``dropped``, ``write_errors``, ``batch_size`` (settable), ``enabled``.
    ``stage(**metrics)`` adds values to the next ``log()`` (for hooks such as the DDP one).
    ``curve_dir`` (or ``RANKWATCH_CURVE_DIR``): CurveZMQ keys for an aggregator run with
    ``serve --curve`` (see ``wire.curve.curve_keys``).
    ``telemetry`` (or ``RANKWATCH_TELEMETRY``): host and accelerator telemetry, polled off the
    training thread and sent as telemetry records (``sources.parse_telemetry``: ``"on"``, the
    default, ``"off"``, source names, an interval such as ``"30s"``; default every 10 s);
    ``ckpt_dir`` (or ``RANKWATCH_CKPT_DIR``): the checkpoint folder whose free disk it reports.
    ``sources`` (or ``RANKWATCH_SOURCES``): more sources, as ``Source`` objects or built-in
    names, sampled the same way.
    While the rank does not step for ``stall_min_s`` (and 3 usual step times), its heartbeats
    carry where the main thread is, at most every ``stall_interval_s`` (``stacks.StallSampler``);
    ``stack_dump_s`` (or ``RANKWATCH_STACK_DUMP_S``, default 600, 0: off) without a step,
    ``faulthandler`` writes every thread's stack to ``rank<k>.stacks.txt`` beside the JSONL
    (with an aggregator address: the sender thread pushes the timer back while steps come).
    ``heartbeat_s`` (or ``RANKWATCH_HEARTBEAT_S``, default 5): the heartbeat interval; the
    aggregator counts a silent rank lost after two of them (or its ``lost_after_s``, if longer).
    ``accept`` (or ``RANKWATCH_ACCEPT``): the commands from the aggregator this rank acts on,
    ``("checkpoint", "stop", "note")`` or some of them, default none (``commands.py``); with
    them, call ``should_stop(step)`` at each step end and register ``on("checkpoint", fn)``.
    """

    def __init__(
        self,
        run: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        addr: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        batch_size: float | None = None,
        heartbeat_s: float | None = None,
        queue_max: int = 10_000,
        enabled: bool = True,
        curve_dir: str | os.PathLike[str] | None = None,
        sources: Iterable[Source | str] | None = None,
        telemetry: str | float | bool | None = None,
        ckpt_dir: str | os.PathLike[str] | None = None,
        stack_dump_s: float | None = None,
        stall_min_s: float = MIN_STALL_S,
        stall_interval_s: float = SAMPLE_INTERVAL_S,
        accept: Iterable[str] | str | None = None,
    ) -> None:
        self._active = False  # log() and event() do nothing until the end of construction
        self._closed = True
        heartbeat_s = heartbeat_s_of(heartbeat_s)
        if isinstance(queue_max, bool) or not isinstance(queue_max, int) or queue_max < 1:
            raise ValueError(f"queue_max must be an int >= 1, got {queue_max!r}")
        accepted = parse_accept(os.environ.get(ACCEPT_ENV) if accept is None else accept)
        self._commands: Commands | None = None
        ident = identity.resolve(run, rank, world_size, addr, log_dir)
        self.run, self.rank, self.world_size = ident.run, ident.rank, ident.world_size
        self.addr, self.host, self.pid = ident.addr, ident.host, ident.pid
        # Absolute: the script may chdir later, and the sender re-reads the file for resends.
        self.jsonl_path = jsonl_path(ident.log_dir.absolute(), ident.run, ident.rank)
        self._batch_size: float | None = None
        self.batch_size = batch_size  # adapters may set it later
        self.heartbeat_s = float(heartbeat_s)
        self._queue_max = queue_max
        self._dropped = 0
        self._metrics_dropped = 0  # user metrics past MAX_METRICS, summed over log() calls
        self._last_step: int | None = None
        self._prev: tuple[int, float] | None = None  # (step, time) of the last timed log
        self._paused: tuple[str, float] | None = None  # (reason, monotonic end)
        self._staged: dict[str, Any] = {}
        self._keys: dict[str, str] = {}  # metric name -> '"name":' ("" for a refused name)
        self._warned: set[Any] = set()
        self._crashed = False
        self._close_lock = threading.RLock()
        self._queue: deque[Any] | None = None
        self._sender: Sender | None = None
        self._sampler: Sampler | None = None
        registry = resolve(
            sources,  # and RANKWATCH_SOURCES
            telemetry=_telemetry(telemetry),
            context=Context(self.jsonl_path.parent, _ckpt_dir(ckpt_dir), dict(os.environ)),
        )
        dump_s = stack_dump_s_of(stack_dump_s)
        self._stall: StallWatch | None = None
        self.incarnation = 0
        if enabled and os.environ.get("MS_ROLE") == "MS_SCHED":
            log.info("rankwatch: MindSpore scheduler process (MS_ROLE=MS_SCHED): monitor disabled")
            enabled = False
        self.enabled = enabled
        if not enabled:
            return
        curve_dir = curve_dir or os.environ.get(CURVE_DIR_ENV) or None
        # A bad key directory is an argument that makes no sense: never fall back to plaintext.
        curve = curve_keys(curve_dir) if curve_dir is not None and self.addr else None
        self._writer = JsonlWriter(self.jsonl_path)
        self._fd = self._writer.fd  # log() writes to it directly; None once closed
        self._seq = itertools.count(self._writer.start_seq + 1)
        # Seqs continue the file's, so its incarnation too; without one (no file, an empty or
        # unwritable one) seqs start at 1 again and must not read as the earlier process's.
        if self._writer.start_seq:
            self.incarnation = self._writer.start_inc
        else:
            self.incarnation = 1 + secrets.randbelow(MAX_INC - 1)
        inc = f'"inc":{self.incarnation},' if self.incarnation else ""
        # The constant part of every step line, serialised once; % fields: seq, time, step,
        # epoch, then (in a cached template) one %r per metric.
        prefix = (
            f'{{"v":{BASE_VERSION},"kind":"step","run":{json.dumps(self.run)},'
            f'"rank":{self.rank},"world_size":{self.world_size},'
            f'"host":{json.dumps(self.host)},"pid":{self.pid},{inc}"seq":'
        )
        self._head = prefix.replace("%", "%%") + '%d,"time":%r,"step":%d,"epoch":%s,"metrics":{'
        self._templates: dict[tuple[str, ...], str] = {}
        self._base = {"run": self.run, "rank": self.rank, "world_size": self.world_size}
        self._base.update(host=self.host, pid=self.pid)
        if self.incarnation:
            self._base["inc"] = self.incarnation
        self._commands = Commands(self.run, self.rank, self.incarnation, accepted, self._ack)
        if self.addr is not None:
            self._stall = StallWatch(
                threading.main_thread().ident or 0, self.jsonl_path, period_s=self.heartbeat_s,
                dump_s=dump_s, min_stall_s=stall_min_s, interval_s=stall_interval_s,
            )  # fmt: skip
            self._queue = deque()
            step_base = {"kind": "step", **self._base}
            self._sender = Sender(
                self.addr,
                self._queue,
                step_base,
                self._heartbeat,
                self.heartbeat_s,
                self._drop,
                self.jsonl_path,
                curve=curve,
                on_command=self._command,
            )
            try:
                self._sender.start()
            except RuntimeError as exc:  # no thread to be had: JSONL only
                log.warning("rankwatch: cannot start the sender thread (%s); JSONL only", exc)
                self._queue = self._sender = None
                self._stall.close()
                self._stall = None
        else:
            global _said_jsonl_only
            if not _said_jsonl_only:
                _said_jsonl_only = True
                log.warning(
                    "rankwatch: no aggregator address (set RANKWATCH_ADDR, MS_SCHED_HOST or "
                    "MASTER_ADDR); writing JSONL only to %s",
                    self.jsonl_path,
                )
        self._closed = False
        self._active = True
        hooks.register(self)
        info = dict(ident.info, addr=self.addr, jsonl=str(self.jsonl_path))
        info["accept"] = sorted(accepted)  # also says this agent knows commands
        self._emit("start", None, info)
        if len(registry):
            self._sampler = Sampler(registry, self._sample)
            try:
                self._sampler.start()
            except RuntimeError as exc:
                log.warning("rankwatch: cannot start the sampler thread (%s); no sources", exc)
                self._sampler = None

    # --- the hot path --------------------------------------------------------------------

    def log(self, step: int, epoch: int | None = None, **metrics: Any) -> None:
        """Record ``metrics`` (name -> number) at ``step``; never raises, never blocks."""
        if not self._active:
            return
        try:
            now = _now()
            if type(step) is not int or not -(2**63) <= step < 2**63:
                index = self._index(step, "step")
                if index is None:
                    return
                step = index
            if epoch is not None and type(epoch) is not int:
                epoch = self._index(epoch, "epoch")
            if self._staged:
                staged, self._staged = self._staged, {}
                metrics = {**staged, **metrics}
            # Fast path: names seen before and finite floats, formatted by one cached template.
            # ``metrics`` is this call's own kwargs dict, so it can go to the sender as it is.
            template = self._templates.get(tuple(metrics))
            if template is not None:
                for v in metrics.values():
                    if type(v) is not float or v - v != 0.0:
                        template = None
                        break
            # The automatic step time (and throughput) go last in the metrics map.
            extra = ""
            prev = self._prev
            if prev is None or step < prev[0]:  # first step, after a pause, or a new count
                self._prev = (step, now)
            elif step > prev[0]:
                self._prev = (step, now)
                if "step_time" not in metrics:
                    step_time = (now - prev[1]) / (step - prev[0])
                    extra = f'"step_time":{step_time!r}'
                    batch = self._batch_size
                    if batch is not None and step_time > 0 and "throughput" not in metrics:
                        throughput = batch / step_time
                        extra += f',"throughput":{throughput!r}'
                    else:
                        throughput = None
            seq = next(self._seq)
            epoch_text = "null" if epoch is None else epoch
            if template is not None:
                line = template % (seq, now, step, epoch_text, *metrics.values())
            else:
                body, metrics = self._convert(metrics)
                line = self._head % (seq, now, step, epoch_text) + body
            if extra:
                line += f",{extra}}}}}\n" if metrics else f"{extra}}}}}\n"
                metrics["step_time"] = step_time
                if throughput is not None:
                    metrics["throughput"] = throughput
            else:
                line += "}}\n"
            # JsonlWriter.write, inlined: one os.write of the whole line before returning.
            data = line.encode()
            fd = self._fd
            try:
                written = -1 if fd is None else _write(fd, data)
                if written != len(data):
                    self._writer.finish(data, written)
            except OSError as exc:
                self._writer.failed(exc)
            self._last_step = step
            queue = self._queue
            if queue is not None:
                if len(queue) < self._queue_max:
                    queue.append((STEP, seq, now, step, epoch, metrics))
                else:
                    self._drop(1)
        except Exception as exc:  # a bug here must not end a training run
            self._warn_once("log", "rankwatch: log() failed and was skipped: %r", exc)

    def _convert(self, metrics: dict[str, Any]) -> tuple[str, dict[str, float]]:
        """The slow path: check names and convert values, returning the metrics' JSON text.

        When every name is usable, a template for this set of names is cached for next time.
        """
        # Room is kept for the automatic step_time and throughput, so the record stays within
        # the aggregator's limit whatever batch_size is now or later.
        if len(metrics) > MAX_METRICS - 2 and len(metrics) > (
            limit := MAX_METRICS - ("step_time" not in metrics) - ("throughput" not in metrics)
        ):
            dropped = len(metrics) - limit
            self._metrics_dropped += dropped
            self._warn_once(
                ("many", hash(tuple(metrics))),
                "rankwatch: %d metrics in one log(); a record holds at most %d, step_time and "
                "throughput included: the last %d of these names are dropped (counted in "
                "Monitor.metrics_dropped)",
                len(metrics),
                MAX_METRICS,
                dropped,
            )
            metrics = dict(itertools.islice(metrics.items(), limit))
        keys = self._keys
        out: dict[str, float] = {}
        parts: list[str] = []
        all_named = True
        for name, v in metrics.items():
            key = keys.get(name)
            if key is None:
                key = self._key(name)
            if not key:
                all_named = False
                continue
            if type(v) is not float:
                try:
                    v = to_float(v)
                except NotANumber as exc:
                    self._warn_once(("value", name), "rankwatch: metric %r skipped: %s", name, exc)
                    continue
            out[name] = v
            parts.append(key + (repr(v) if v - v == 0.0 else _nonfinite(v)))
        if all_named and len(self._templates) < MAX_TEMPLATES:
            body = ",".join(
                (keys.get(name) or self._key(name)).replace("%", "%%") + "%r" for name in metrics
            )
            self._templates[tuple(metrics)] = self._head + body
        return ",".join(parts), out

    def _key(self, name: Any) -> str:
        reason = check_name(name)
        key = "" if reason else json.dumps(name) + ":"
        if reason:
            self._warn_once(("name", name), "rankwatch: metric skipped: %s", reason)
        if len(self._keys) < MAX_KEY_CACHE:
            self._keys[name] = key
        return key

    def _index(self, value: Any, what: str) -> int | None:
        """``value`` as an int step or epoch (numpy ints, 5.0, one-element tensors); or None."""
        number: int | None = None
        if not isinstance(value, bool):
            try:
                number = operator.index(value)
            except TypeError:
                try:
                    f = to_float(value)
                    number = int(f) if f.is_integer() else None
                except NotANumber:
                    pass
        if number is not None and -(2**63) <= number < 2**63:
            return number
        self._warn_once(what, "rankwatch: %s %r is not an integer; record skipped", what, value)
        return None

    def _drop(self, count: int) -> None:
        self._dropped += count
        self._warn_once(
            "dropped",
            "rankwatch: send queue full (%d records): records are being dropped "
            "from sending (the JSONL file keeps them); see 'dropped' in heartbeats",
            self._queue_max,
        )

    def _warn_once(self, key: Any, message: str, *args: Any) -> None:
        if key in self._warned or len(self._warned) >= MAX_WARNINGS:
            return
        self._warned.add(key)
        log.warning(message, *args)

    # --- everything else -----------------------------------------------------------------

    def stage(self, **metrics: Any) -> None:
        """Values added to the next ``log()`` call (explicit ones there win); for hooks."""
        self._staged.update(metrics)

    def event(self, kind: str, step: int | None = None, **info: Any) -> None:
        """Record an event (``records.EVENT_KINDS``; an unknown kind becomes a ``note``)."""
        if self._active:
            try:
                self._emit(kind, step, info)
            except Exception as exc:
                self._warn_once("event", "rankwatch: event() failed and was skipped: %r", exc)

    def _emit(self, kind: str, step: Any, info: dict[str, Any]) -> None:
        if kind not in EVENT_KINDS:
            self._warn_once(("event", kind), "rankwatch: unknown event %r logged as a note", kind)
            info = {"kind": str(kind), **info}
            kind = "note"
        if step is not None and type(step) is not int:
            step = self._index(step, "step")
        if kind == "crash" and info.get("fatal") is not False:
            self._crashed = True  # the crash is the rank's last word: no "end" after it
        wire = {"kind": "event", **self._base, "seq": next(self._seq), "time": time.time()}
        wire.update(event=kind, step=step, info=plain(info))
        self._write_and_queue(wire, self._queue_max + EVENT_SLACK)

    def _write_and_queue(self, wire: dict[str, Any], limit: int) -> None:
        line = json.dumps({"v": BASE_VERSION, **wire}, allow_nan=False, separators=_COMPACT)
        self._writer.write((line + "\n").encode("utf-8", "replace"))
        queue = self._queue
        if queue is not None:
            if len(queue) < limit:
                queue.append(wire)
            else:
                self._drop(1)

    def _heartbeat(self) -> dict[str, Any] | None:
        """One heartbeat (sender thread): written to JSONL, returned for sending."""
        if self._closed:
            return None
        next_in, paused = self.heartbeat_s, None
        if self._paused is not None:
            reason, until = self._paused
            left = until - time.monotonic()
            if left > 0:
                next_in, paused = max(next_in, left), reason
        wire: dict[str, Any] = {"kind": "heartbeat", "run": self.run, "rank": self.rank}
        if self.incarnation:
            wire["inc"] = self.incarnation
        wire["seq"] = next(self._seq)
        wire.update(time=time.time(), last_step=self._last_step, next_in=next_in)
        wire.update(dropped=self._dropped, paused=paused)
        if self._stall is not None:
            try:
                stack = self._stall.beat(wire["time"], self._prev, paused is not None)
            except Exception as exc:  # a bug here must not cost the heartbeat or the thread
                self._warn_once("stall", "rankwatch: stack sampling failed: %r", exc)
                stack = None
            if stack is not None:
                wire["stack"] = stack
        line = json.dumps({"v": BASE_VERSION, **wire}, separators=_COMPACT)
        self._writer.write((line + "\n").encode("utf-8", "replace"))
        return wire

    def _sample(self, source: str, sample: Any, at: float) -> None:
        """One source's sample (sampler thread): a telemetry record, written and queued."""
        if not self._active:
            return
        ident: dict[str, Any] = {"run": self.run, "rank": self.rank}
        if self.incarnation:
            ident["inc"] = self.incarnation
        where = {"host": self.host, "pid": self.pid}
        wire = telemetry_wire(ident, where, source, sample, at, self._seq.__next__, self._warn_once)
        if wire is None:
            return
        self._writer.write((json_line(wire) + "\n").encode("utf-8", "replace"))
        queue = self._queue
        if queue is not None:
            if len(queue) < self._queue_max:
                queue.append(wire)
            else:
                self._drop(1)

    # --- commands from the aggregator (commands.py) --------------------------------------

    def should_stop(self, step: int | None = None) -> bool:
        """Call at each step end: runs the checkpoint handlers due by ``step`` (default: the
        last logged step) and says whether a ``stop`` for this step has come. Cheap; at the
        step a command names it may wait for the aggregator's go (``HOLD_MAX_S`` at most)."""
        commands = self._commands
        if commands is None:
            return False
        return commands.poll(self._last_step if step is None else step)

    def on(self, kind: str, fn: Handler) -> None:
        """Call ``fn(step)`` when a command of ``kind`` is acted on (``checkpoint``: save
        there, return the path; ``note``: ``fn(text)``). On the training thread."""
        if self._commands is not None:
            self._commands.on(kind, fn)

    @property
    def commands(self) -> Commands | None:
        """This rank's command state (what it accepts, counts, ``stopping``)."""
        return self._commands

    def _command(self, raw: dict[str, Any]) -> None:
        """A command map from the aggregator (sender thread)."""
        if self._commands is not None and self._active:
            self._commands.receive(raw, self._last_step)

    def _ack(self, ack: Ack) -> None:
        if self._active:
            try:
                self._emit(ACK_EVENT, ack.step, ack.info())
            except Exception as exc:
                self._warn_once("ack", "rankwatch: a command's ack failed: %r", exc)

    def pause(self, seconds: float, reason: str = "checkpoint") -> _Pause:
        """Announce that no step will come for ``seconds`` (checkpointing, evaluation, ...)."""
        try:
            seconds = float(seconds)
            if not 0 < seconds < math.inf:
                raise ValueError
        except (TypeError, ValueError):
            self._warn_once("pause", "rankwatch: pause(%r): not a duration; using 60 s", seconds)
            seconds = 60.0
        reason = str(reason)[:256]
        if self._active:
            self._paused = (reason, time.monotonic() + seconds)
            self._prev = None  # a step time across the pause would mean nothing
            self.event("pause", self._last_step, seconds=seconds, reason=reason)
            if self._sender is not None:
                self._sender.beat_now()
        return _Pause(self)

    def resume(self) -> None:
        """End an announced pause early (``with mon.pause(...)`` does this on exit)."""
        if self._active and self._paused is not None:
            reason, _ = self._paused
            self._paused = None
            self._prev = None
            self.event("resume", self._last_step, reason=reason)
            if self._sender is not None:
                self._sender.beat_now()

    @property
    def batch_size(self) -> float | None:
        """Samples per step on this rank; with it, ``log()`` adds ``throughput`` (samples/s)."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: float | None) -> None:
        try:
            size = None if value is None else to_float(value)
        except NotANumber as exc:
            size = None
            log.warning("rankwatch: batch_size %r ignored: %s", value, exc)
        if size is not None and not 0 < size < math.inf:
            log.warning("rankwatch: batch_size %r ignored: not a positive number", value)
            size = None
        self._batch_size = size

    @property
    def dropped(self) -> int:
        """Records that could not be queued for sending (they are still in the JSONL file)."""
        return self._dropped

    @property
    def metrics_dropped(self) -> int:
        """Metric values dropped because a log() named more than a record holds."""
        return self._metrics_dropped

    @property
    def write_errors(self) -> int:
        """JSONL writes that failed (full disk, ...)."""
        return self._writer.errors if self.enabled else 0

    def close(self, reason: str = "normal") -> None:
        """Send ``end`` and stop; idempotent, returns within ``CLOSE_TIMEOUT_S`` (+0.1 s)."""
        with self._close_lock:
            if self._closed:  # also a SIGTERM arriving while this thread is closing
                return
            self._closed = True
            self._active = False
            if self._stall is not None:
                self._stall.close()
            if self._sampler is not None:
                self._sampler.close(SAMPLER_CLOSE_S)
            try:
                if not self._crashed:
                    self._emit("end", self._last_step, {"reason": str(reason)[:256]})
            except Exception as exc:
                log.warning("rankwatch: could not record the end event: %r", exc)
            if self._sender is not None and not self._sender.close(CLOSE_TIMEOUT_S):
                log.warning("rankwatch: sender did not stop within %.1f s", CLOSE_TIMEOUT_S)
            self._fd = None
            self._writer.close()
            hooks.forget(self)

    def _crash(self, exc: BaseException, tb: TracebackType | None, thread: str | None) -> None:
        if not self._active:
            return
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        info = {
            "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc)[:4096],
            "traceback": text[-TRACEBACK_CHARS:],
            "thread": thread or threading.current_thread().name,
            "fatal": thread is None,
        }
        self._emit("crash", self._last_step, info)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.close("normal")
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            self.close(type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else "exit")
        else:
            self._crash(exc, tb, None)
            self.close("crash")

    def __repr__(self) -> str:
        return f"Monitor(run={self.run!r}, rank={self.rank}, world_size={self.world_size})"


def _telemetry(setting: str | float | bool | None) -> Telemetry:
    """The argument's telemetry setting, else ``RANKWATCH_TELEMETRY``'s, parsed."""
    if setting is not None:
        return parse_telemetry(setting)
    env = os.environ.get(TELEMETRY_ENV)
    try:
        return parse_telemetry(env)
    except ValueError as exc:
        raise ValueError(f"{TELEMETRY_ENV}={env!r}: {exc}") from None


def _ckpt_dir(given: str | os.PathLike[str] | None) -> Path | None:
    folder = given if given is not None else os.environ.get(CKPT_DIR_ENV) or None
    return None if folder is None else Path(folder).absolute()


def heartbeat_s_of(value: float | None) -> float:
    """The heartbeat interval from the argument or ``RANKWATCH_HEARTBEAT_S`` (default
    ``HEARTBEAT_S``); ValueError for anything but a finite number of seconds > 0."""
    if value is None:
        text = os.environ.get(HEARTBEAT_ENV)
        if not text:
            return HEARTBEAT_S
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            raise ValueError(f"{HEARTBEAT_ENV} must be a number of seconds > 0, got {text!r}")
        return seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"heartbeat_s must be a number of seconds, got {value!r}")
    if not 0 < value < math.inf:
        raise ValueError(f"heartbeat_s must be > 0 seconds, got {value!r}")
    return float(value)
