"""Hugging Face ``Trainer`` adapter: ``watch(trainer)``, a ``TrainerCallback`` plus one wrapper.

Importing this module imports transformers (``rankwatch.agent`` itself never does)::

    from rankwatch.agent.hf import watch
    watch(trainer)  # before trainer.train()

Why more than a callback: the Trainer logs a loss already averaged over the processes
(``_maybe_log_save_evaluate`` all-gathers its running sum and takes the mean), and no callback
argument carries the per-process value. The one public place that sees it is
``Trainer.training_step``: it returns this process's loss of one micro-batch (divided by the
accumulation steps, or normalised by the step's token count), the value the Trainer then adds to
its running sum. ``watch`` wraps that method on the instance; a step's ``loss`` is the sum over
its micro-batches, so the mean of the ranks' ``loss`` is the Trainer's logged ``loss`` (before
its ``logging_nan_inf_filter``, which hides a NaN; rankwatch records it). Reading the Trainer's
running sum instead would rest on a private attribute that has changed between versions.

Each optimizer step every rank records ``loss``, ``lr`` (the rate the step used), ``grad_norm``
(the Trainer's own norm, from ``accelerator.clip_grad_norm_``, which it calls once per step: the
norm after the all-reduce, the same on every rank), ``grad_norm_local`` (this rank's norm before
DDP's all-reduce, through the comm hook of ``rankwatch.agent.torch``, installed on the DDP model
the first ``training_step`` receives, before its backward), ``step_time`` and ``throughput``
(samples of the step on this rank). ``on_evaluate``'s metrics (``eval_loss``, ...) are logged
at their step as their own series. The Monitor is created when training begins (rank and world
size from the Trainer's arguments, run name rank 0's) and closed when it ends, unless one was
given.
"""

from __future__ import annotations

import math
from typing import Any

from rankwatch.agent.adapter import MonitorSpec, WarnOnce, batch_len, plain_metrics
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.torch import optimizer_lr, try_local_grad_norm_hook
from transformers import TrainerCallback

__all__ = ["RankwatchCallback", "watch"]

WRAPPED = "_rankwatch_wrapped"  # marks the methods watch() replaced, so it never wraps twice


def _broadcast_run(run: str) -> str:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return run
    box = [run]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


class RankwatchCallback(TrainerCallback):
    """Record every rank's training values through a rankwatch ``Monitor``; use ``watch``.

    Alone (without ``watch``) it records lr, eval metrics and the timings but no loss or grad
    norm: those come from the wrapped ``training_step`` and ``clip_grad_norm_``.
    ``monitor``: an existing Monitor (left open), or None to create one from ``run``, ``rank``,
    ``world_size``, ``addr``, ``log_dir`` (None: from the Trainer and the environment).
    ``log_interval``: record every this many optimizer steps.
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        log_interval: int = 1,
        grad_norm_local: bool = True,
        run: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        addr: str | None = None,
        log_dir: str | None = None,
    ) -> None:
        self._spec = MonitorSpec(run, rank, world_size, addr, log_dir)
        if monitor is not None and (self._spec.given() or log_dir is not None):
            raise ValueError(
                "RankwatchCallback: pass either a Monitor or run/rank/world_size/addr/log_dir"
            )
        if type(log_interval) is not int or log_interval < 1:
            raise ValueError(
                f"RankwatchCallback: log_interval must be an int >= 1, got {log_interval!r}"
            )
        self.log_interval = log_interval
        self.grad_norm_local = grad_norm_local
        self._monitor = monitor
        self._owns = monitor is None
        self._warn = WarnOnce("rankwatch RankwatchCallback: ")
        self._step = 0  # the global step last seen
        self.watched = False  # set by watch(): training_step and clip_grad_norm_ feed it
        self._hooked = False  # comm hook tried (once: DDP takes one)
        self._loss: Any = None  # this step's sum of micro-batch losses (a tensor, no sync)
        self._samples = 0
        self._grad_norm: Any = None
        self._lr: dict[str, float] = {}

    @property
    def monitor(self) -> Monitor | None:
        return self._monitor

    # --- fed by the wrappers watch() installs -------------------------------------------

    def model_seen(self, model: Any) -> None:
        """The model ``training_step`` gets (DDP when distributed), before its first backward:
        DDP takes a comm hook only then."""
        if self._hooked or self._monitor is None:
            return
        self._hooked = True
        if self.grad_norm_local:
            try:
                try_local_grad_norm_hook(model, self._monitor)
            except Exception:
                self._warn("hook", "installing the comm hook failed", exc_info=True)

    def micro_batch(self, inputs: Any, loss: Any) -> None:
        """One ``training_step``'s loss (this process's) and batch size."""
        if self._monitor is None:
            return
        try:
            if loss is not None and hasattr(loss, "detach"):
                loss = loss.detach()
                self._loss = loss if self._loss is None else self._loss + loss
            self._samples += batch_len(inputs) or 0
        except Exception:
            self._warn("micro", "recording a training_step failed", exc_info=True)

    def grad_norm(self, norm: Any) -> None:
        self._grad_norm = norm

    # --- TrainerCallback -----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            if self._monitor is None:
                self._monitor = self._spec.open(args.process_index, args.world_size, _broadcast_run)
        except Exception:  # monitoring must never stop training
            self._warn("setup", "setup failed, training continues unmonitored", exc_info=True)
        if not self.watched:
            self._warn(
                "watch",
                "added without watch(trainer): no per-rank loss or grad norm is recorded; "
                "use rankwatch.agent.hf.watch(trainer) instead of callbacks=[...]",
            )
        self._step = state.global_step
        self._loss, self._samples, self._grad_norm = None, 0, None

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Before the scheduler steps: the rate this step used, as the Trainer logs it.
        self._lr = optimizer_lr([kwargs.get("optimizer")])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        try:
            step, previous = state.global_step, self._step
            self._step = step
            loss, self._loss = self._loss, None
            samples, self._samples = self._samples, 0
            norm, self._grad_norm = self._grad_norm, None
            if step // self.log_interval == previous // self.log_interval:
                return
            metrics: dict[str, Any] = dict(self._lr)
            if loss is not None:
                metrics["loss"] = loss
            if norm is not None:
                metrics["grad_norm"] = norm
            if samples:
                monitor.batch_size = samples / max(1, step - previous)
            epoch = state.epoch
            monitor.log(step, epoch=math.floor(epoch) if epoch is not None else None, **metrics)
        except Exception:
            self._warn("step", "step end failed", exc_info=True)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics = kwargs.get("metrics")
        if self._monitor is None or not isinstance(metrics, dict):
            return
        try:
            values = plain_metrics(metrics, ("loss", "lr", "grad_norm", "epoch"))
            values = {k: v for k, v in values.items() if isinstance(v, (int, float))}
            if values:
                self._monitor.log(state.global_step, **values)
        except Exception:
            self._warn("eval", "recording the evaluation failed", exc_info=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._owns and self._monitor is not None:
            monitor, self._monitor = self._monitor, None  # a later train() makes another
            monitor.close()


def _wrap_clip(trainer: Any, callback: RankwatchCallback) -> None:
    accelerator: Any = getattr(trainer, "accelerator", None)
    clip = getattr(accelerator, "clip_grad_norm_", None)
    if clip is None or getattr(clip, WRAPPED, False):
        return

    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        norm = clip(*args, **kwargs)
        callback.grad_norm(norm)
        return norm

    setattr(clip_grad_norm_, WRAPPED, True)
    accelerator.clip_grad_norm_ = clip_grad_norm_  # on the instance: this Trainer only


def watch(
    trainer: Any, callback: RankwatchCallback | None = None, **kwargs: Any
) -> RankwatchCallback:
    """Add a ``RankwatchCallback`` (``callback``, or one made from ``kwargs``) to ``trainer``
    and wrap its ``training_step`` so that each rank's own loss reaches it. Returns the callback."""
    if callback is None:
        callback = RankwatchCallback(**kwargs)
    elif kwargs:
        raise ValueError("watch: pass either a callback or its arguments, not both")
    step = trainer.training_step
    if getattr(step, WRAPPED, False):
        raise ValueError("watch: this trainer is watched already")
    trainer.add_callback(callback)

    def training_step(*args: Any, **kw: Any) -> Any:
        # The accelerator may be made again when training starts: wrap the current one.
        _wrap_clip(trainer, callback)
        callback.model_seen(args[0] if args else kw.get("model"))
        loss = step(*args, **kw)
        callback.micro_batch(args[1] if len(args) > 1 else kw.get("inputs"), loss)
        return loss

    setattr(training_step, WRAPPED, True)
    trainer.training_step = training_step
    callback.watched = True
    return callback
