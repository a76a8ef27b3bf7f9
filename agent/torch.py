"""PyTorch helpers: the per-rank gradient norm. ``torch`` is imported inside the functions.

Which norm? In ``DistributedDataParallel`` the gradients are all-reduced *during*
``backward()``, so after it every rank holds the same averaged gradients and ``grad_norm(model)``
is the same number on every rank: useful for clipping, useless for telling ranks apart. What
exposes a bad rank (corrupt data, a faulty device) is the norm of the rank's *own* gradients
before the all-reduce. Two ways to get it:

* ``install_local_grad_norm_hook(ddp_model, monitor)`` wraps DDP's all-reduce in a
  communication hook that takes each bucket's norm before reducing it and, once the last
  bucket is in, stages ``grad_norm_local`` for the next ``monitor.log()``. It changes nothing
  else: the hook then calls DDP's default all-reduce (sum, divided by the world size).
* Or compute the backward of a step under ``with ddp_model.no_sync():`` (no all-reduce), call
  ``grad_norm(ddp_model)``, and reduce yourself; typical with gradient accumulation.

Without DDP (or in a single process) ``grad_norm`` after ``backward()`` is the local norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch as _torch

    from .monitor import Monitor

LOCAL_GRAD_NORM = "grad_norm_local"  # metric name staged by the comm hook


def _tensors(model_or_parameters: Any) -> list[_torch.Tensor]:
    import torch

    if isinstance(model_or_parameters, torch.nn.Module):
        params: Iterable[Any] = model_or_parameters.parameters()
    elif isinstance(model_or_parameters, torch.Tensor):
        params = [model_or_parameters]
    else:
        params = model_or_parameters
    grads = []
    for p in params:
        grad = p.grad if isinstance(p, torch.Tensor) and p.grad is not None else None
        if grad is not None:
            grads.append(grad.detach().coalesce().values() if grad.is_sparse else grad.detach())
    return grads


def grad_norm(model_or_parameters: Any, norm_type: float = 2.0) -> float:
    """The global ``norm_type`` norm of all gradients of a module or iterable of parameters.

    0.0 when no parameter has a gradient; NaN or inf when a gradient holds one (that is the
    point of monitoring it). On a GPU this waits for the backward to finish.
    """
    import torch

    grads = _tensors(model_or_parameters)
    if not grads:
        return 0.0
    norm_type = float(norm_type)
    if norm_type == math.inf:
        device = grads[0].device
        return float(torch.stack([g.abs().max().to(device) for g in grads]).max().item())
    return float(torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False).item())


class LocalGradNorm:
    """State of the hook installed by ``install_local_grad_norm_hook``.

    ``value`` is the last completed per-rank norm (a 0-d tensor, read lazily so the hook never
    waits for the GPU), or None before the first step.
    """

    def __init__(
        self, monitor: Monitor | None, name: str, norm_type: float, process_group: Any
    ) -> None:
        self.monitor = monitor
        self.name = name
        self.norm_type = float(norm_type)
        self.process_group = process_group
        self.value: _torch.Tensor | None = None
        self._partial: _torch.Tensor | None = None

    def add(self, buffer: _torch.Tensor, last: bool) -> None:
        import torch

        p = self.norm_type
        part = torch.linalg.vector_norm(buffer.detach(), p, dtype=torch.float32)
        if p != math.inf:
            part = part**p
        if self._partial is None:
            self._partial = part
        elif p == math.inf:
            self._partial = torch.maximum(self._partial, part)
        else:
            self._partial = self._partial + part
        if last:
            total = self._partial if p == math.inf else self._partial ** (1.0 / p)
            self._partial = None
            self.value = total
            if self.monitor is not None:
                self.monitor.stage(**{self.name: total})


def install_local_grad_norm_hook(
    ddp_model: Any,
    monitor: Monitor | None,
    *,
    name: str = LOCAL_GRAD_NORM,
    norm_type: float = 2.0,
    process_group: Any = None,
) -> LocalGradNorm:
    """Register a DDP comm hook that records this rank's gradient norm before the all-reduce.

    Each step the norm is staged on ``monitor`` as ``name`` and goes out with its next
    ``log()``. A DDP model takes one comm hook: this one replaces the default all-reduce with
    the same all-reduce, so do not combine it with another hook (such as fp16 compression).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state = LocalGradNorm(monitor, name, norm_type, process_group)

    # No annotations: DDP rejects a hook whose annotations are not its own types, and under
    # ``from __future__ import annotations`` they would be strings.
    def hook(state, bucket):
        try:
            state.add(bucket.buffer(), bucket.is_last())
        except Exception:  # never break the all-reduce over a metric
            state._partial = None
        return default_hooks.allreduce_hook(state.process_group, bucket)

    ddp_model.register_comm_hook(state, hook)
    return state


def optimizer_lr(optimizers: Iterable[Any]) -> dict[str, float]:
    """``lr`` of the first parameter group, plus ``lr/<i>`` for every group (numbered across
    ``optimizers``) when the groups' rates differ. Empty when there is no group."""
    rates: list[float] = []
    for optimizer in optimizers:
        for group in getattr(optimizer, "param_groups", ()):
            lr = group.get("lr") if isinstance(group, dict) else None
            if lr is not None:
                try:
                    rates.append(float(lr))
                except (TypeError, ValueError):  # a tensor lr of several elements, ...
                    continue
    if not rates:
        return {}
    out = {"lr": rates[0]}
    if len(set(rates)) > 1:
        out.update({f"lr/{i}": rate for i, rate in enumerate(rates)})
    return out


def try_local_grad_norm_hook(model: Any, monitor: Monitor | None) -> LocalGradNorm | None:
    """``install_local_grad_norm_hook`` on a DDP model, or None (with the reason logged) when
    ``model`` is no ``DistributedDataParallel`` or already has a comm hook (a framework's own,
    such as fp16 compression: DDP takes one)."""
    import logging

    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    try:
        return install_local_grad_norm_hook(model, monitor)
    except (RuntimeError, AssertionError, ValueError) as exc:
        logging.getLogger("rankwatch.agent").warning(
            "rankwatch: no per-rank grad norm (%s): the DDP model has a comm hook already: %s",
            LOCAL_GRAD_NORM,
            exc,
        )
        return None
