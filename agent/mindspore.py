"""MindSpore adapter: ``TrainMonitor``, a ``mindspore.train.Callback`` feeding a ``Monitor``.

Importing this module imports MindSpore (``rankwatch.agent`` itself never does)::

    from rankwatch.agent.mindspore import TrainMonitor
    model.train(epochs, dataset, callbacks=[TrainMonitor()])

Only the ``on_train_*`` hooks are used (the old names log warnings and ``model.fit`` rejects them).

What ``cb_params.net_outputs`` becomes (metric names):

================================================== ==============================================
network output                                     metrics
================================================== ==============================================
scalar Tensor / number                             ``loss``
``(loss, overflow: bool Tensor, loss_scale)``      ``loss``, ``overflow`` (0/1), ``loss_scale``
MindFormers ``(loss, overflow, scaling_sens[, lr   ... plus ``lr``, ``grad_norm``, and
[, global_norm[, local_norm, norm_size]]])``       ``grad_norm_local/<i>``, ``norm_size/<i>`` as
                                                   they are (``local_norm`` holds square sums:
                                                   ``rankwatch.agent.mindformers`` maps it)
tuple / list of loss components                    ``loss`` (the SUM: what ``TrainOneStepCell``
                                                   back-propagates), ``loss/0``, ``loss/1``, ...
dict of loss components                            ``loss`` (sum), ``loss/<key>``
nested tuples / dicts                              dotted names: ``loss/0.1``, ``loss/aux.kl``
``GradNormTrainOneStepCell`` ``(loss, norm)``      ``loss``, ``grad_norm_local``
``TrainMonitor(outputs=("loss", "x", None))``      names by position (None skips), no detection
================================================== ==============================================

The loss-scale tuple is recognised by structure (3 to 7 items, the second a bool), so its items
are never summed. A structure holding a single number gives just ``loss``. Tensors with a few
elements (<= ``MAX_VECTOR_ELEMENTS``) become ``<name>/<i>``; bigger ones are skipped with one
warning. A train network may declare its output names in a
``rankwatch_outputs`` attribute, as ``GradNormTrainOneStepCell`` does.

Also recorded: ``lr`` (every ``lr_interval`` steps: the rate used for the step just trained,
``lr/<i>`` per distinct parameter-group rate), ``update_ratio`` (‖Δw‖/‖w‖ over the optimizer's
parameters, every ``update_ratio_interval`` steps, 0 = off; in dataset sink mode Δw spans one
sink), ``weights/<layer>/mean`` and ``/var`` for the named parameter-name prefixes, and an
``eval`` event with ``model.fit``'s validation results. Steps are global: they keep counting
across epochs and across ``model.train()`` calls, and in sink mode they are the real step numbers;
with ``log_interval`` > 1 each epoch's last step is logged as well. ``data_time`` is the host
time from the previous step's end to this step's begin (data loading): the one place a slow
rank shows in synchronous data parallelism. An exception leaving
``model.train`` (seen in the callback's ``__exit__``) becomes a ``crash`` event and closes the
Monitor; a normal end closes it only if ``TrainMonitor`` created it.

Commands from the aggregator (``accept=("checkpoint", "stop")`` or ``RANKWATCH_ACCEPT``; default
none): ``checkpoint`` saves the train network with ``mindspore.save_checkpoint`` at the end of
the agreed step (``checkpoint_dir``, default ``checkpoints/`` beside the JSONL, or your
``checkpoint(step, cb_params)``), ``stop`` calls ``run_context.request_stop()`` at the end of
the agreed step, the same on every rank (``mindspore_actions.py``).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence
from typing import Any, TypedDict

import mindspore as ms
import numpy as np
from mindspore.train import Callback, RunContext
from rankwatch.agent.mindspore_actions import CheckpointSaver, SaveFn, checkpoint_dir
from rankwatch.agent.mindspore_cells import (
    GRAD_NORM_OUTPUTS,
    MAX_VECTOR_ELEMENTS,
    GradNormTrainOneStepCell,
    LrReader,
    info_value,
    output_metrics,
)
from rankwatch.agent.monitor import Monitor

__all__ = [
    "GRAD_NORM_OUTPUTS",
    "MAX_VECTOR_ELEMENTS",
    "GradNormTrainOneStepCell",
    "LrReader",
    "TrainMonitor",
    "output_metrics",
]

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2_000  # MindSpore error messages carry long C++ stacks: keep the head
# Keep the tail of a traceback (the frames nearest the error), short enough that the Monitor,
# which cuts every event string to its first 4096 characters, keeps all of it.
MAX_TRACEBACK_CHARS = 4_000
RESERVED_NAMES = ("step", "epoch")  # Monitor.log's own arguments


class _MonitorArgs(TypedDict):
    """What ``TrainMonitor`` hands the Monitor it creates (None: from the environment)."""

    run: str | None
    rank: int | None
    world_size: int | None
    addr: str | None
    log_dir: str | None
    telemetry: str | float | bool | None
    ckpt_dir: str | None


# --- the callback ------------------------------------------------------------------------


def _crossed(step: int, previous: int, interval: int) -> bool:
    """True when a multiple of ``interval`` lies in (previous, step] (steps jump in sink mode)."""
    return interval > 0 and step // interval > previous // interval


def _check_interval(name: str, value: int, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise ValueError(f"TrainMonitor: {name} must be an int >= {minimum}, got {value!r}")
    return value


class TrainMonitor(Callback):
    """Record every rank's training metrics through a rankwatch ``Monitor``.

    ``monitor``: an existing Monitor (left open at the end of training), or None to create one
    at the start of training from ``run``, ``rank``, ``world_size``, ``addr``, ``log_dir``,
    ``telemetry`` and ``ckpt_dir`` (None = from the environment; see ``Monitor``) and close it
    when training ends.
    ``batch_size`` (samples per step on this rank, for throughput): defaults to
    ``train_dataset.get_batch_size()``. Intervals are in steps; ``lr_interval`` defaults to
    ``log_interval`` and 0 turns lr off; ``weight_stats_interval`` defaults to ``log_interval``.
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        log_interval: int = 1,
        lr_interval: int | None = None,
        batch_size: int | None = None,
        outputs: Sequence[str | None] | None = None,
        update_ratio_interval: int = 0,
        weight_stats_layers: Sequence[str] = (),
        weight_stats_interval: int | None = None,
        run: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        addr: str | None = None,
        log_dir: str | None = None,
        telemetry: str | float | bool | None = None,
        ckpt_dir: str | None = None,
        accept: Sequence[str] | str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint: SaveFn | None = None,
    ) -> None:
        super().__init__()
        self._accept = accept  # for the Monitor it creates (a given one has its own)
        self._checkpoint_dir = checkpoint_dir
        self._checkpoint = checkpoint
        self._saver: CheckpointSaver | None = None
        self._monitor_args: _MonitorArgs = {
            "run": run,
            "rank": rank,
            "world_size": world_size,
            "addr": addr,
            "log_dir": log_dir,
            "telemetry": telemetry,
            "ckpt_dir": ckpt_dir,
        }
        if monitor is not None and any(v is not None for v in self._monitor_args.values()):
            raise ValueError(
                "TrainMonitor: pass either a Monitor or "
                "run/rank/world_size/addr/log_dir/telemetry/ckpt_dir, not both"
            )
        self.log_interval = _check_interval("log_interval", log_interval, 1)
        lr_default = log_interval if lr_interval is None else lr_interval
        self.lr_interval = _check_interval("lr_interval", lr_default, 0)
        stats_default = log_interval if weight_stats_interval is None else weight_stats_interval
        self.weight_stats_interval = _check_interval("weight_stats_interval", stats_default, 1)
        self.update_ratio_interval = _check_interval(
            "update_ratio_interval", update_ratio_interval, 0
        )
        if batch_size is not None:
            _check_interval("batch_size", batch_size, 1)
        self.batch_size = batch_size
        if isinstance(weight_stats_layers, str):
            weight_stats_layers = (weight_stats_layers,)
        self.weight_stats_layers = tuple(weight_stats_layers)
        if not all(isinstance(n, str) and n for n in self.weight_stats_layers):
            raise ValueError("TrainMonitor: weight_stats_layers must be parameter-name prefixes")
        self.outputs = None if outputs is None else tuple(outputs)
        if self.outputs is not None:
            for name in self.outputs:
                if name is not None and (not isinstance(name, str) or not name):
                    raise ValueError(f"TrainMonitor: outputs names must be strings, got {name!r}")
                if name in RESERVED_NAMES:
                    raise ValueError(f"TrainMonitor: {name!r} is reserved, rename that output")
        self._monitor = monitor
        self._owns_monitor = monitor is None
        if monitor is not None:
            self._attach(monitor)
        self._closed = False
        self._disabled = False  # no Monitor could be made (bad address, ...): stay quiet
        self._crash: BaseException | None = None
        self._last_step = 0  # global step of the last step end seen (0 before any)
        self._logged_step = 0  # last step actually logged
        self._offset = 0  # added to cb_params.cur_step_num, which restarts on each train()
        self._stride = 1  # steps per step-end callback (sink_size in dataset sink mode)
        self._names: tuple[str | None, ...] | None = None
        self._optimizer: ms.nn.Optimizer | None = None
        self._lr: LrReader | None = None
        self._ratio_params: list[Any] = []
        self._snapshot: list[np.ndarray] | None = None
        self._layer_params: dict[str, list[Any]] = {}
        self._warned: set[str] = set()
        self._begin_t: float | None = None  # perf_counter at this step's begin
        self._end_t: float | None = None  # ... and at the previous step's end

    # --- Monitor ownership ---------------------------------------------------------------

    @property
    def monitor(self) -> Monitor:
        """The Monitor records go to (created on first use when none was given)."""
        return self._monitor if self._monitor is not None else self._ensure_monitor()

    def _ensure_monitor(self) -> Monitor:
        """The Monitor, (re)created when owned and missing or closed by an earlier train()."""
        if self._monitor is None or (self._closed and self._owns_monitor):
            args = self._monitor_args.copy()
            if self._monitor is not None and args["run"] is None:
                args["run"] = self._monitor.run  # a later train() continues the same run
            self._monitor = Monitor(**args, batch_size=self.batch_size, accept=self._accept)
            self._closed = False
        self._attach(self._monitor)
        return self._monitor

    def _attach(self, monitor: Monitor) -> None:
        """Make ``monitor``'s checkpoint command save through this callback (once)."""
        if self._saver is None or self._saver.monitor is not monitor:
            where = checkpoint_dir(monitor.jsonl_path, self._checkpoint_dir)
            self._saver = CheckpointSaver(where, monitor.rank, self._checkpoint)
            self._saver.monitor = monitor
            monitor.on("checkpoint", self._saver)

    @property
    def step(self) -> int:
        """Global step of the last step end seen."""
        return self._last_step

    def _warn_once(self, key: str, message: str, *args: Any, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args, exc_info=exc_info)

    # --- hooks ---------------------------------------------------------------------------

    def on_train_begin(self, run_context: RunContext) -> None:
        self._disabled = False
        try:
            self._begin(run_context.original_args())
        except Exception:  # monitoring must never stop training
            log.exception("rankwatch TrainMonitor: setup failed, training continues unmonitored")
            self._disabled = self._monitor is None or (self._closed and self._owns_monitor)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self._begin_t = time.perf_counter()

    def on_train_step_end(self, run_context: RunContext) -> None:
        if self._disabled:
            return
        end = time.perf_counter()
        try:
            cb_params = run_context.original_args()
            self._step_end(cb_params, force=False)
            if self._saver is not None:
                self._saver.cb_params = cb_params
            if self._monitor is not None and self._monitor.should_stop(self._last_step):
                run_context.request_stop()  # model.train returns after this step
        except Exception:
            self._warn_once("step", "rankwatch TrainMonitor: step end failed", exc_info=True)
        self._end_t = end

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        if self._disabled:
            return
        try:
            cb_params = run_context.original_args()
            if self._logged_step < self._last_step:  # the epoch's last step, off the interval
                self._step_end(cb_params, force=True)
            results = cb_params.get("eval_results") or cb_params.get("metrics")
            if isinstance(results, dict) and results:
                info = {str(k): info_value(v) for k, v in results.items()}
                info = {k: v for k, v in info.items() if k not in ("step", "kind")}
                info["epoch"] = self._epoch(cb_params)
                self.monitor.event("eval", step=self._last_step, **info)
        except Exception:
            self._warn_once("epoch", "rankwatch TrainMonitor: epoch end failed", exc_info=True)

    def on_train_end(self, run_context: RunContext) -> None:
        if self._owns_monitor and not self._closed and self._monitor is not None:
            self._closed = True
            try:
                self._monitor.close()
            except Exception:
                log.exception("rankwatch TrainMonitor: closing the monitor failed")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # MindSpore enters the callback around each train() and eval; on a crash on_train_end
        # never runs, so this is the one place that sees the exception.
        # Nested eval (model.fit) exits twice with the same exception: record it once.
        if exc_type is None or (exc is not None and exc is self._crash):
            return
        self._crash = exc
        try:
            trace = "".join(traceback.format_exception(exc_type, exc, tb))
            monitor = self._ensure_monitor()
            self._closed = True
            monitor.event(
                "crash",
                step=self._last_step or None,
                exc_type=f"{exc_type.__module__}.{exc_type.__qualname__}",
                message=str(exc)[:MAX_MESSAGE_CHARS],
                traceback=trace[-MAX_TRACEBACK_CHARS:],
            )
            monitor.close(reason="crash")
        except Exception:
            log.exception("rankwatch TrainMonitor: recording the crash failed")

    # --- internals -----------------------------------------------------------------------

    @staticmethod
    def _epoch(cb_params: Any) -> int | None:
        epoch = cb_params.get("cur_epoch_num")
        return int(epoch) if epoch is not None else None

    def _begin(self, cb_params: Any) -> None:
        monitor = self._ensure_monitor()
        self._offset = max(0, self._last_step - int(cb_params.get("cur_step_num") or 0))
        if self.batch_size is not None:
            monitor.batch_size = self.batch_size
        elif getattr(monitor, "batch_size", None) is None:
            dataset = cb_params.get("train_dataset")
            try:
                size = dataset.get_batch_size() if dataset is not None else None
            except Exception:  # datasets without a batch op or from generators may refuse
                size = None
            if isinstance(size, int) and size > 0:
                monitor.batch_size = size
        network = cb_params.get("train_network")
        optimizer = cb_params.get("optimizer") or getattr(network, "optimizer", None)
        self._optimizer = optimizer if isinstance(optimizer, ms.nn.Optimizer) else None
        if self._optimizer is None:
            self._lr = None
        elif self._lr is None or self._lr.optimizer is not self._optimizer:
            self._lr = LrReader(self._optimizer)
        declared = getattr(network, "rankwatch_outputs", None)
        self._names = self.outputs if self.outputs is not None else declared
        if self.update_ratio_interval or self.weight_stats_layers:
            self._find_params(cb_params, network)
        interval = self.update_ratio_interval
        if interval and _crossed(self._last_step + 1, self._last_step, interval):
            self._snapshot = self._weights()

    def _find_params(self, cb_params: Any, network: Any) -> None:
        if self._optimizer is not None:
            params = list(self._optimizer.parameters)
        else:
            owner = cb_params.get("network") or network
            params = list(owner.trainable_params()) if owner is not None else []
        self._ratio_params = params
        self._layer_params = {}
        for layer in self.weight_stats_layers:
            matched = [p for p in params if p.name == layer or p.name.startswith(layer + ".")]
            if matched:
                self._layer_params[layer] = matched
            else:
                self._warn_once(
                    f"layer:{layer}",
                    "rankwatch TrainMonitor: weight_stats_layers entry %r matches no parameter; "
                    "parameter names start with: %s",
                    layer,
                    sorted({p.name.rsplit(".", 1)[0] for p in params})[:20],
                )

    def _weights(self) -> list[np.ndarray]:
        return [np.array(p.asnumpy(), dtype=np.float64) for p in self._ratio_params]

    def _step_end(self, cb_params: Any, force: bool) -> None:
        step = self._offset + int(cb_params.cur_step_num)
        previous = self._last_step
        if not force:
            if step > previous:
                self._stride = step - previous
            self._last_step = step
        metrics: dict[str, float] = {}
        if not force:
            on_interval = _crossed(step, previous, self.log_interval)
            metrics.update(self._every_step(cb_params, step, on_interval))
        if force or _crossed(step, previous, self.log_interval):
            skipped: list[str] = []
            metrics.update(self._output_metrics(cb_params.get("net_outputs"), skipped))
            if skipped:
                self._warn_once("skipped", "rankwatch TrainMonitor: not recording %s", skipped)
            if self._lr is not None and _crossed(step, previous, self.lr_interval):
                metrics.update(self._lr())
            if not force and self._end_t is not None and self._begin_t is not None:
                # Host time between steps (data loading, callbacks): in synchronous data
                # parallelism a slow rank shows here, while everyone's step time rises alike.
                metrics["data_time"] = max(0.0, self._begin_t - self._end_t)
        if not force:
            self._measure_weights(step, previous, metrics)
        if metrics or (not force and _crossed(step, previous, self.log_interval)):
            self.monitor.log(step, epoch=self._epoch(cb_params), **metrics)
            self._logged_step = step

    def _output_metrics(self, outputs: Any, skipped: list[str]) -> dict[str, float]:
        """Metrics from ``cb_params.net_outputs``; a framework built on MindSpore whose train
        cell returns its own tuple overrides this."""
        return output_metrics(outputs, self._names, skipped)

    def _every_step(self, cb_params: Any, step: int, on_interval: bool) -> dict[str, float]:
        """Called at every step end (``on_interval``: this step is on the log interval); what it
        returns is logged at ``step``. For counters a subclass must see on every step."""
        return {}

    def _measure_weights(self, step: int, previous: int, metrics: dict[str, float]) -> None:
        interval = self.update_ratio_interval
        if interval and self._ratio_params:
            if self._snapshot is not None and _crossed(step, previous, interval):
                now = self._weights()
                pairs = zip(now, self._snapshot, strict=True)
                delta = sum(float(np.sum((w - s) ** 2)) for w, s in pairs)
                norm = sum(float(np.sum(w**2)) for w in now)
                with np.errstate(divide="ignore", invalid="ignore"):
                    metrics["update_ratio"] = float(np.sqrt(delta) / np.sqrt(norm))
                self._snapshot = None
            if _crossed(step + self._stride, step, interval):  # the next step end measures
                self._snapshot = self._weights()
        if self._layer_params and _crossed(step, previous, self.weight_stats_interval):
            for layer, params in self._layer_params.items():
                values = np.concatenate([p.asnumpy().astype(np.float64).ravel() for p in params])
                metrics[f"weights/{layer}/mean"] = float(values.mean())
                metrics[f"weights/{layer}/var"] = float(values.var())
