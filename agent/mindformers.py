"""MindFormers adapter: ``RankwatchMonitor``, a callback in MindFormers' own registry.

Importing this module imports MindSpore, and MindFormers where it is installed; the callback is
then registered as a MindFormers ``callback``, so a YAML config can name it::

    callbacks:
      - type: MFLossMonitor
      - type: RankwatchMonitor      # import rankwatch.agent.mindformers before building the trainer

or in code: ``Trainer(args, task=..., callbacks=[RankwatchMonitor()])``. Without MindFormers the
registration is skipped with one warning and ``RankwatchMonitor`` is a plain MindSpore callback.

What it records on every rank (the local values, never a cross-rank mean):

================================================== ==============================================
MindFormers output (``MFTrainOneStepCell``,        metrics
``MFPipelineWithLossScaleCell``)
================================================== ==============================================
``loss`` (mean of the loss Tensor; in pipeline     ``loss`` (divided like ``MFLossMonitor``'s when
parallelism only on the last stage's ranks)        one is in the callback list)
``overflow``, ``scaling_sens``, ``learning_rate``  ``overflow`` (0/1), ``loss_scale``, ``lr``
``global_norm`` (with ``use_clip_grad``)           ``grad_norm``
``local_norm`` (per-group SQUARE sums of this      ``grad_norm_local`` = sqrt(sum): this rank's
rank's unscaled gradients before the all-reduce)   gradient norm before the all-reduce
``size``                                           (not recorded: it never changes)
================================================== ==============================================

Counters, cumulative over the steps the callback sees (one per sink in dataset sink mode):
``skipped_steps`` (steps whose optimizer update was skipped: an overflow, or a global norm at or
over the threshold with ``use_skip_data_by_global_norm``) and ``grad_norm_spikes`` (steps with
``grad_norm`` at or over ``global_norm_spike_threshold``: this callback's argument, else the train
cell's when it skips by norm, else a ``TrainingStateMonitor``'s ``monitor_config`` threshold).
Each spike is also a ``note`` event (``note="grad_norm_spike"``, ``grad_norm``, ``threshold``,
``skipped``).

A ``TrainingStateMonitor`` in the same callback list writes what the user enabled in
``monitor_config`` (local loss, local norm, device local norm and loss, weight and optimizer
state norms, ...) to its log or TensorBoard only; every value it writes is also recorded here
under its own tag (``local_norm/<param>``, ``device_local_norm``, ``local_lm_loss``, ...; the
per-micro-batch ``micro_local_<x>_loss`` lines as their mean ``local_<x>_loss``), at its step.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
from mindspore.train import RunContext
from rankwatch.agent.mindspore import TrainMonitor
from rankwatch.agent.mindspore_cells import output_metrics
from rankwatch.agent.monitor import Monitor

__all__ = ["REGISTERED", "RankwatchMonitor", "mindformers_metrics", "register", "state_metrics"]

log = logging.getLogger(__name__)

OUTPUT_LENGTHS = (3, 4, 5, 7)  # the tuples MindFormers' MFLossMonitor reads (_get_loss_output)
OUTPUT_NAMES = ("loss", "overflow", "loss_scale", "lr", "grad_norm")
MICRO_PREFIX = "micro_"  # TrainingStateMonitor's per-micro-batch local loss lines (log format)


# --- values (pure) -------------------------------------------------------------------------


def _is_bool_tensor(value: Any) -> bool:
    return isinstance(value, ms.Tensor) and value.dtype == ms.bool_


def is_mindformers_output(outputs: Any) -> bool:
    """True for the tuple of MindFormers' train cells: 3, 4, 5 or 7 items, the second a bool."""
    return (
        isinstance(outputs, (tuple, list))
        and len(outputs) in OUTPUT_LENGTHS
        and (_is_bool_tensor(outputs[1]) or isinstance(outputs[1], bool))
    )


def mindformers_metrics(outputs: Any, skipped: list[str] | None = None) -> dict[str, float]:
    """Metrics from a MindFormers train cell's output (see the module docstring); any other
    output is mapped as ``TrainMonitor`` maps it."""
    if not is_mindformers_output(outputs):
        return output_metrics(outputs, None, skipped)
    out: dict[str, float] = {}
    parts = list(output_metrics(outputs[0], ("loss",), skipped).values())
    if parts:  # a loss Tensor with a few elements: MFLossMonitor logs their mean
        out["loss"] = sum(parts) / len(parts)
    for name, item in zip(OUTPUT_NAMES[1:], outputs[1:5], strict=False):
        if item is not None:
            out.update(output_metrics(item, (name,), skipped))
    if len(outputs) == 7 and outputs[5] is not None:
        squares = outputs[5]
        if isinstance(squares, ms.Tensor):
            total = float(squares.astype(ms.float32).asnumpy().astype("float64").sum())
            out["grad_norm_local"] = math.sqrt(total) if total >= 0 else math.nan
    return out


def state_metrics(tag: str, data: Any) -> dict[str, float]:
    """One ``TrainingStateMonitor._output(tag, data, ...)`` call as metrics: numbers and small
    arrays under ``tag`` (``tag/<i>``), a dict of numbers as ``tag/<key>``; text is skipped."""
    if isinstance(data, dict):
        keys = [f"{tag}/{key}" for key in data]
        return output_metrics(list(data.values()), keys)
    return output_metrics(data, (tag,))


class StateCollector:
    """Collects what a ``TrainingStateMonitor`` outputs, per step, until the step is logged.

    The per-micro-batch local losses it writes to its log come one call each: they are kept as
    lists and logged as their mean, the value its TensorBoard output (``local_<x>_loss``) holds.
    """

    def __init__(self) -> None:
        self._values: dict[int, dict[str, float]] = {}
        self._micro: dict[int, dict[str, list[float]]] = {}

    def add(self, step: int, tag: str, data: Any) -> None:
        if tag.startswith(MICRO_PREFIX):
            name = tag[len(MICRO_PREFIX) :]
            for value in state_metrics(name, data).values():
                self._micro.setdefault(step, {}).setdefault(name, []).append(value)
        else:
            self._values.setdefault(step, {}).update(state_metrics(tag, data))

    def pop(self, step: int) -> dict[str, float]:
        """The metrics of ``step`` (and forgets them)."""
        out = {name: sum(v) / len(v) for name, v in self._micro.pop(step, {}).items() if v}
        out.update(self._values.pop(step, {}))
        return out

    def pop_before(self, step: int) -> dict[int, dict[str, float]]:
        """Everything held for steps before ``step``, by step (and forgets it)."""
        steps = sorted({s for s in (*self._values, *self._micro) if s < step})
        return {s: self.pop(s) for s in steps}

    def __bool__(self) -> bool:
        return bool(self._values or self._micro)


# --- the callback --------------------------------------------------------------------------


class RankwatchMonitor(TrainMonitor):
    """``TrainMonitor`` for MindFormers: its output tuple, counters and ``TrainingStateMonitor``.

    Takes ``TrainMonitor``'s arguments (all plain values, so a YAML ``callbacks:`` entry can set
    them) and ``global_norm_spike_threshold`` (None: the train cell's or the
    ``TrainingStateMonitor``'s, see the module docstring). ``training_state=False`` leaves a
    ``TrainingStateMonitor`` in the list alone. ``lr_interval`` defaults to 0: the lr comes with
    the output tuple (set it to also read the optimizer's schedule, as ``TrainMonitor`` does).
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        global_norm_spike_threshold: float | None = None,
        training_state: bool = True,
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
    ) -> None:
        # The lr is in MindFormers' output tuple: the optimizer's schedule is not read again.
        super().__init__(
            monitor,
            log_interval=log_interval,
            lr_interval=0 if lr_interval is None else lr_interval,
            batch_size=batch_size,
            outputs=outputs,
            update_ratio_interval=update_ratio_interval,
            weight_stats_layers=weight_stats_layers,
            weight_stats_interval=weight_stats_interval,
            run=run,
            rank=rank,
            world_size=world_size,
            addr=addr,
            log_dir=log_dir,
        )
        if global_norm_spike_threshold is not None:
            threshold = global_norm_spike_threshold
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
                raise ValueError(
                    "RankwatchMonitor: global_norm_spike_threshold must be a number, "
                    f"got {threshold!r}"
                )
            if not threshold > 0:
                raise ValueError(
                    f"RankwatchMonitor: global_norm_spike_threshold must be > 0, got {threshold!r}"
                )
        self.global_norm_spike_threshold = global_norm_spike_threshold
        self.training_state = bool(training_state)
        self.skipped_steps = 0
        self.grad_norm_spikes = 0
        self._threshold: float | None = None  # in force for this train()
        self._skip_by_norm = False  # the train cell skips the update at a spike
        self._loss_divisor = 1.0
        self._loss_valid = True  # False on the ranks of a pipeline's earlier stages
        self._states = StateCollector()
        self._teed: list[Any] = []  # TrainingStateMonitors whose output is copied here

    # --- hooks ---------------------------------------------------------------------------

    def on_train_begin(self, run_context: RunContext) -> None:
        super().on_train_begin(run_context)
        if self._disabled:
            return
        try:
            self._attach(run_context.original_args())
        except Exception:
            log.exception("rankwatch RankwatchMonitor: MindFormers setup failed, values stay")

    def on_train_end(self, run_context: RunContext) -> None:
        self._detach()
        if not self._disabled and self._states:
            try:
                for step, values in self._states.pop_before(self._last_step + 1).items():
                    self.monitor.log(step, None, **values)
            except Exception:
                self._warn_once(
                    "state", "rankwatch: recording training state failed", exc_info=True
                )
        super().on_train_end(run_context)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._detach()
        super().__exit__(exc_type, exc, tb)

    # --- TrainMonitor's extension points -------------------------------------------------

    def _output_metrics(self, outputs: Any, skipped: list[str]) -> dict[str, float]:
        if self._names is not None:
            return output_metrics(outputs, self._names, skipped)
        metrics = mindformers_metrics(outputs, skipped)
        if is_mindformers_output(outputs):
            metrics["skipped_steps"] = float(self.skipped_steps)
            metrics["grad_norm_spikes"] = float(self.grad_norm_spikes)
        if "loss" in metrics:
            if not self._loss_valid:
                del metrics["loss"]
            elif self._loss_divisor != 1.0:
                metrics["loss"] /= self._loss_divisor
        return metrics

    def _every_step(self, cb_params: Any, step: int, on_interval: bool) -> dict[str, float]:
        out: dict[str, float] = {}
        outputs = cb_params.get("net_outputs")
        if is_mindformers_output(outputs):
            self._count(outputs, step)
        for earlier, values in self._states.pop_before(step).items():
            self.monitor.log(earlier, None, **values)  # a state output that came after its step end
        out.update(self._states.pop(step))
        return out

    # --- internals -----------------------------------------------------------------------

    def _count(self, outputs: Sequence[Any], step: int) -> None:
        overflow = bool(output_metrics(outputs[1], ("overflow",)).get("overflow"))
        norm = None
        if len(outputs) >= 5 and outputs[4] is not None:
            norm = output_metrics(outputs[4], ("grad_norm",)).get("grad_norm")
        spike = self._threshold is not None and norm is not None and norm >= self._threshold
        if overflow or (spike and self._skip_by_norm):
            self.skipped_steps += 1
        if spike:
            self.grad_norm_spikes += 1
            self.monitor.event(
                "note",
                step=step,
                note="grad_norm_spike",
                grad_norm=norm,
                threshold=self._threshold,
                skipped=bool(self._skip_by_norm and not overflow),
            )

    def _attach(self, cb_params: Any) -> None:
        network = cb_params.get("train_network")
        self._skip_by_norm = bool(getattr(network, "use_skip_data_by_global_norm", False))
        threshold = self.global_norm_spike_threshold
        if threshold is None and self._skip_by_norm:
            threshold = getattr(network, "global_norm_spike_threshold", None)
        callbacks = list(cb_params.get("list_callback") or [])
        states = [cb for cb in callbacks if _is_instance(cb, "TrainingStateMonitor")]
        for state in states:
            if threshold is None and (
                getattr(state, "check_for_global_norm", False)
                or getattr(state, "use_skip_data_by_global_norm", False)
            ):
                threshold = getattr(state, "global_norm_spike_threshold", None)
        self._threshold = float(threshold) if isinstance(threshold, (int, float)) else None
        losses = [cb for cb in callbacks if _is_instance(cb, "MFLossMonitor")]
        self._loss_divisor = _loss_divisor(losses[0]) if losses else 1.0
        self._loss_valid = _on_last_stage(self.monitor)
        if self.training_state:
            for state in states:
                self._tee(state)

    def _tee(self, state: Any) -> None:
        """Copy every value ``state`` (a TrainingStateMonitor) outputs into this rank's record."""
        if any(state is teed for teed in self._teed):
            return
        original: Callable[..., Any] = state._output

        def output(tag: Any, data: Any, global_step: Any, formats: Any) -> Any:
            result = original(tag, data, global_step, formats)
            if formats:  # the monitor only computes what has a format; keep the same rule
                try:
                    step = self._offset + int(global_step)
                    if step <= self._logged_step:  # its step end already went by
                        self.monitor.log(step, None, **state_metrics(str(tag), data))
                    else:
                        self._states.add(step, str(tag), data)
                except Exception:
                    self._warn_once("state", "rankwatch: a training-state value was not recorded")
            return result

        state._output = output
        self._teed.append(state)

    def _detach(self) -> None:
        for state in self._teed:
            with contextlib.suppress(AttributeError):
                del state._output  # the instance attribute: the class's method shows again
        self._teed = []


def _is_instance(obj: Any, name: str) -> bool:
    """isinstance against MindFormers' class ``name``, by name along the MRO (no import)."""
    return any(
        cls.__name__ == name and cls.__module__.startswith("mindformers.")
        for cls in type(obj).__mro__
    )


def _loss_divisor(loss_monitor: Any) -> float:
    """What ``MFLossMonitor._fix_loss_for_parallel`` divides the loss by, from its settings."""
    divisor = 1.0
    per_token = bool(getattr(loss_monitor, "calculate_per_token_loss", False))
    stages = ms.get_auto_parallel_context("pipeline_stages") or 1
    micro = getattr(loss_monitor, "mirco_size", 1) or 1  # sic: MindFormers' attribute name
    if stages > 1 and not per_token:
        divisor *= micro
    divisor *= getattr(loss_monitor, "micro_batch_interleave_num", 1) or 1
    accumulation = getattr(loss_monitor, "gradient_accumulation_steps", 1) or 1
    if accumulation > 1 and not per_token:
        divisor *= accumulation
    return float(divisor)


def _on_last_stage(monitor: Monitor) -> bool:
    """True unless pipeline parallelism puts this rank before the last stage (whose loss is the
    only real one: MindFormers' own check, from the rank and world size the Monitor has)."""
    stages = ms.get_auto_parallel_context("pipeline_stages") or 1
    world = getattr(monitor, "world_size", None)
    rank = getattr(monitor, "rank", None)
    if stages <= 1 or not isinstance(world, int) or not isinstance(rank, int) or world < stages:
        return True
    return rank // (world // stages) + 1 == stages


# --- registration --------------------------------------------------------------------------


def register() -> bool:
    """Register ``RankwatchMonitor`` as a MindFormers callback; False (one warning) when
    MindFormers cannot be imported."""
    try:
        from mindformers.tools.register import (  # type: ignore[import-not-found]
            MindFormerModuleType,
            MindFormerRegister,
        )
    except Exception as exc:  # not installed, or one of its own dependencies missing
        log.warning(
            "rankwatch: MindFormers is not importable (%s: %s), so RankwatchMonitor is not in "
            "its registry and a YAML 'callbacks:' entry cannot name it; it still works as a "
            "MindSpore callback (Model.train(..., callbacks=[RankwatchMonitor()]))",
            type(exc).__name__,
            exc,
        )
        return False
    MindFormerRegister.register_cls(RankwatchMonitor, MindFormerModuleType.CALLBACK)
    return True


REGISTERED = register()
