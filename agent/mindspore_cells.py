"""MindSpore-side pieces of the adapter: the grad-norm train cell and the value readers.

``GradNormTrainOneStepCell`` returns this rank's gradient norm with the loss;
``output_metrics`` turns ``cb_params.net_outputs`` into metrics and ``LrReader`` reads the
learning rate of the step just trained (see ``rankwatch.agent.mindspore`` for the mapping).
Imported by ``rankwatch.agent.mindspore``; importing it imports MindSpore.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common import dtype as mstype
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

# Names of the outputs of GradNormTrainOneStepCell, by position. TrainMonitor reads this attribute
# from the train network, so Model(GradNormTrainOneStepCell(...)) needs no further configuration.
GRAD_NORM_OUTPUTS = ("loss", "grad_norm_local")
MAX_VECTOR_ELEMENTS = 32  # a non-scalar output up to this size is recorded element by element
LOSS_SCALE_NAMES = (
    "loss",
    "overflow",
    "loss_scale",
    "lr",
    "grad_norm",
    "grad_norm_local",
    "norm_size",
)

_square_sum = ops.MultitypeFuncGraph("rankwatch_square_sum")


@_square_sum.register("Tensor")
def _tensor_square_sum(grad: Any) -> Any:
    # float32 so that float16 / bfloat16 gradients do not overflow in the sum of squares
    return ops.reduce_sum(ops.square(ops.cast(grad, mstype.float32)))


class GradNormTrainOneStepCell(nn.TrainOneStepCell):
    """``TrainOneStepCell`` that returns ``(loss, grad_norm_local)``.

    ``grad_norm_local`` is the global L2 norm of this rank's gradients, measured BEFORE the
    data-parallel all-reduce: after the all-reduce every rank holds the same gradients, so only
    the local norm tells a bad rank apart (its norm stands out, typically about 2x the others).
    The norm is of the unscaled gradients (divided by ``sens``).

    ``network`` must return a scalar loss (e.g. ``nn.WithLossCell``). Use it with
    ``Model(GradNormTrainOneStepCell(net_with_loss, optimizer))``; ``TrainMonitor`` recognises
    the output (via ``rankwatch_outputs``) and records ``loss`` and ``grad_norm_local``.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, sens: float | None = 1.0) -> None:
        if sens is None:
            sens = 1.0
        super().__init__(network, optimizer, sens=float(sens))
        self.hyper_map = ops.HyperMap()
        self.rankwatch_outputs = GRAD_NORM_OUTPUTS

    def construct(self, *inputs: Any) -> Any:
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        squares = self.hyper_map(_square_sum, grads)
        grad_norm_local = ops.sqrt(ops.addn(squares)) / self.sens
        grads = self.grad_reducer(grads)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, grad_norm_local


# --- network outputs -> metrics ----------------------------------------------------------


def _as_array(value: Any) -> np.ndarray | None:
    """A Tensor / numpy value / number as a float64 array; None for anything else."""
    if isinstance(value, ms.Tensor):
        if value.dtype == ms.bfloat16:  # numpy has no bfloat16: asnumpy() gives raw bytes
            value = value.astype(ms.float32)
        array = value.asnumpy()
    elif isinstance(value, (bool, int, float, np.number, np.bool_, np.ndarray)):
        array = np.asarray(value)
    else:
        return None
    if array.dtype.kind not in "biuf":
        return None
    return array.astype(np.float64)


def _is_bool(value: Any) -> bool:
    if isinstance(value, ms.Tensor):
        return value.dtype == ms.bool_
    return isinstance(value, (bool, np.bool_))


def info_value(value: Any) -> float | str | None:
    """An eval result as a plain float (msgpack cannot pack numpy scalars) or text."""
    array = _as_array(value)
    if array is not None and array.size == 1:
        return float(array.reshape(()))
    return None if value is None else str(value)


def _leaves(value: Any, name: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{name}.{key}" if name else str(key))
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{name}.{index}" if name else str(index))
    else:
        yield name, value


def _put(out: dict[str, float], name: str, value: Any, skipped: list[str]) -> None:
    array = _as_array(value)
    if array is None:
        return
    if array.size == 1:
        out[name] = float(array.reshape(()))
    elif array.size <= MAX_VECTOR_ELEMENTS:
        for index, item in enumerate(array.reshape(-1)):
            out[f"{name}/{index}"] = float(item)
    else:
        skipped.append(f"{name} (shape {tuple(array.shape)})")


def output_metrics(
    outputs: Any, names: Sequence[str | None] | None = None, skipped: list[str] | None = None
) -> dict[str, float]:
    """Metrics from ``cb_params.net_outputs`` (see the module docstring for the mapping).

    ``names``: explicit names by tuple position (None skips a position). Outputs too big to
    record are appended to ``skipped`` (as ``"name (shape ...)"``).
    """
    skipped = [] if skipped is None else skipped
    out: dict[str, float] = {}
    if names is not None:
        items = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        for name, item in zip(names, items, strict=False):
            if name is not None:
                _put(out, name, item, skipped)
        if len(items) > len(names):
            skipped.append(f"outputs {len(names)}..{len(items) - 1} (no name in outputs=)")
        return out
    if not isinstance(outputs, (tuple, list, dict)):
        _put(out, "loss", outputs, skipped)
        return out
    if isinstance(outputs, (tuple, list)) and 3 <= len(outputs) <= 7 and _is_bool(outputs[1]):
        for name, item in zip(LOSS_SCALE_NAMES, outputs, strict=False):
            _put(out, name, item, skipped)
        return out
    parts: dict[str, float] = {}
    for name, item in _leaves(outputs, ""):
        _put(parts, f"loss/{name}", item, skipped)
    if len(parts) == 1:
        return {"loss": next(iter(parts.values()))}
    if parts:
        out["loss"] = float(sum(parts.values()))
        out.update(parts)
    return out


# --- learning rate -----------------------------------------------------------------------


class LrReader:
    """Reads the learning rate ``optimizer`` used for the step just trained.

    ``optimizer.get_lr()`` would give the NEXT step's rate (``global_step`` is already
    incremented at step end) and raises after the last item of a list lr, so the schedule is
    evaluated at ``global_step - 1`` instead. A ``LearningRateSchedule`` is compiled once with
    ``ms.jit``: called as a Cell in PyNative mode it costs milliseconds per read.
    """

    def __init__(self, optimizer: nn.Optimizer) -> None:
        self.optimizer = optimizer
        rates = optimizer.learning_rate
        self.schedules: list[Any] = []  # one per distinct group rate, in parameter order
        for schedule in rates if optimizer.is_group_lr else [rates]:
            if not any(schedule is seen for seen in self.schedules):
                self.schedules.append(schedule)  # group_lr repeats one object per parameter
        self._compiled: dict[int, Any] = {}

    def __call__(self) -> dict[str, float]:
        """``lr``, plus ``lr/<i>`` per distinct rate when the optimizer groups parameters."""
        step_index = int(self.optimizer.global_step.asnumpy().reshape(-1)[0]) - 1
        values = [self._value(i, schedule, step_index) for i, schedule in enumerate(self.schedules)]
        if not self.optimizer.is_group_lr:
            return {} if values[0] is None else {"lr": values[0]}
        out = {f"lr/{i}": v for i, v in enumerate(values) if v is not None}
        if "lr/0" in out:
            out["lr"] = out["lr/0"]
        return out

    def _value(self, index: int, schedule: Any, step_index: int) -> float | None:
        kind = type(schedule).__name__
        if kind == "_IteratorLearningRate":  # a list / 1-D Tensor lr: index it
            rates = schedule.learning_rate.asnumpy().reshape(-1)
            return float(rates[step_index]) if 0 <= step_index < rates.size else None
        if kind == "_ConvertToCell":  # a constant wrapped for a group of a dynamic-lr optimizer
            return float(schedule.learning_rate.asnumpy().reshape(()))
        if isinstance(schedule, ms.Tensor):  # Parameter: constant lr
            return float(schedule.asnumpy().reshape(-1)[0])
        if isinstance(schedule, LearningRateSchedule):
            step = ms.Tensor(step_index, ms.int32)
            compiled = self._compiled.get(index)
            if compiled is None:
                compiled = schedule  # in GRAPH mode calling the Cell runs a compiled graph
                if ms.get_context("mode") == ms.PYNATIVE_MODE:
                    try:
                        compiled = ms.jit(schedule.construct)
                        compiled(step)
                    except Exception:  # a schedule jit cannot compile: call the Cell itself
                        compiled = schedule
                self._compiled[index] = compiled
            return float(compiled(step).asnumpy().reshape(-1)[0])
        return None
