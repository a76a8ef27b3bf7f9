"""PyTorch Lightning (2.x) adapter: ``RankwatchCallback``, a ``Callback`` that runs on every rank.

Importing this module imports Lightning (``rankwatch.agent`` itself never does)::

    from rankwatch.agent.lightning import RankwatchCallback
    trainer = Trainer(strategy="ddp", callbacks=[RankwatchCallback()])

Why a callback and not a logger: Lightning calls its loggers on rank 0 only, with values
already reduced when ``sync_dist=True``; a callback runs in every rank's process and sees that
rank's own numbers.

At every optimizer step (``trainer.global_step``) each rank records:

* ``loss``: its own ``training_step`` loss, from ``outputs`` (the mean over the micro-batches
  of the step with ``accumulate_grad_batches``);
* every value the module logged with ``self.log(...)`` and ``sync_dist=False`` during the step
  (Lightning's names: ``<name>_step`` when also logged per epoch); synced values are the same
  on every rank, so they tell no rank apart and Lightning's own loggers keep them;
* ``lr`` (the rate the step used; ``lr/<i>`` per parameter group when they differ),
  ``step_time``, ``throughput`` (samples of the step on this rank, from the batch's first
  dimension unless ``batch_size`` is given) and ``data_time`` (host time from the previous
  batch's end to this batch's start);
* ``grad_norm_local``: this rank's gradient norm before DDP's all-reduce, through the comm hook
  of ``rankwatch.agent.torch`` (when the strategy's model is a DDP one without a comm hook).

Epoch-level values with ``sync_dist=False`` (``on_epoch=True``: training ``<name>_epoch`` and
the validation metrics, after each validation run but not the sanity check) are logged at the
step they belong to, as their own series. An exception leaving ``fit`` is recorded as a
``crash`` event and closes the Monitor; a normal end closes it when the callback created it.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import lightning.pytorch as pl
from rankwatch.agent.adapter import MonitorSpec, WarnOnce, batch_len, plain_metrics
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.torch import LOCAL_GRAD_NORM, optimizer_lr, try_local_grad_norm_hook

__all__ = ["RankwatchCallback", "logged_values"]

OWN_NAMES = ("loss", "lr", "step_time", "throughput", "data_time", LOCAL_GRAD_NORM)


def logged_values(trainer: pl.Trainer, on_step: bool) -> dict[str, Any]:
    """The values of ``self.log`` with ``sync_dist=False`` now held by the active loop: the
    last step's (``on_step``) or the epoch's reduction, by the names Lightning's loggers use."""
    results = getattr(trainer, "_results", None)
    if results is None:
        return {}
    out: dict[str, Any] = {}
    for _, metric in results.valid_items():
        meta = metric.meta
        if meta.sync.should or (meta.on_step if on_step else meta.on_epoch) is False:
            continue
        value = results._get_cache(metric, on_step)
        if value is not None:
            out[results._forked_name(metric, on_step)[1]] = value
    return out


class RankwatchCallback(pl.Callback):
    """Record every rank's training values through a rankwatch ``Monitor``.

    ``monitor``: an existing Monitor (left open at the end), or None to create one when fit
    starts, from ``run``, ``rank``, ``world_size``, ``addr``, ``log_dir`` (None: the trainer's
    rank and world size, the rest from the environment; the run name is rank 0's on every rank).
    ``batch_size``: samples per batch on this rank (default: read from each batch).
    ``log_interval``: record every this many optimizer steps (values of the steps between are
    not averaged: the step recorded is the one seen).
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        log_interval: int = 1,
        batch_size: int | None = None,
        grad_norm_local: bool = True,
        run: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        addr: str | None = None,
        log_dir: str | None = None,
    ) -> None:
        super().__init__()
        self._spec = MonitorSpec(run, rank, world_size, addr, log_dir, batch_size)
        if monitor is not None and (self._spec.given() or log_dir is not None):
            raise ValueError(
                "RankwatchCallback: pass either a Monitor or run/rank/world_size/addr/log_dir"
            )
        if type(log_interval) is not int or log_interval < 1:
            raise ValueError(
                f"RankwatchCallback: log_interval must be an int >= 1, got {log_interval!r}"
            )
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError(
                f"RankwatchCallback: batch_size must be an int >= 1, got {batch_size!r}"
            )
        self.log_interval = log_interval
        self.batch_size = batch_size
        self.grad_norm_local = grad_norm_local
        self._monitor = monitor
        self._owns = monitor is None
        self._warn = WarnOnce("rankwatch RankwatchCallback: ")
        self._step = 0  # the global step last seen
        self._loss: Any = None  # sum of this step's micro-batch losses (as given: normalized)
        self._samples = 0  # samples of this step's micro-batches
        self._begin_t: float | None = None
        self._end_t: float | None = None
        self._data_time: float | None = None
        self._lr: dict[str, float] = {}

    @property
    def monitor(self) -> Monitor | None:
        """The Monitor records go to (None before fit starts when the callback makes it)."""
        return self._monitor

    # --- hooks ---------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        try:
            if self._monitor is None:
                strategy = trainer.strategy
                self._monitor = self._spec.open(
                    trainer.global_rank,
                    trainer.world_size,
                    (lambda run: strategy.broadcast(run, src=0))
                    if trainer.world_size > 1
                    else None,
                )
            if self.grad_norm_local:
                try_local_grad_norm_hook(trainer.strategy.model, self._monitor)
            self._step = trainer.global_step
        except Exception:  # monitoring must never stop training
            self._warn("setup", "setup failed, training continues unmonitored", exc_info=True)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._begin_t = time.perf_counter()
        if self._end_t is not None and self._data_time is None:
            # Host time between batches (data loading): in synchronous data parallelism a
            # slow rank shows here while everyone's step time rises alike.
            self._data_time = max(0.0, self._begin_t - self._end_t)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        # Lightning steps the schedulers before on_train_batch_end: read the rate this step uses.
        self._lr = optimizer_lr(trainer.optimizers)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        try:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "detach"):
                loss = loss.detach()
                self._loss = loss if self._loss is None else self._loss + loss
            self._samples += self.batch_size or batch_len(batch) or 0
            step = trainer.global_step
            if step > self._step:
                self._step_end(trainer, pl_module, monitor, step)
        except Exception:
            self._warn("step", "step end failed", exc_info=True)
        self._end_t = time.perf_counter()

    def _step_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, monitor: Monitor, step: int
    ) -> None:
        previous, self._step = self._step, step
        loss, self._loss = self._loss, None
        samples, self._samples = self._samples, 0
        data_time, self._data_time = self._data_time, None
        if step // self.log_interval == previous // self.log_interval:
            return
        metrics = plain_metrics(logged_values(trainer, on_step=True), OWN_NAMES)
        if loss is not None:  # Lightning divided each micro-batch's by the accumulation
            metrics["loss"] = loss
        metrics.update(self._lr or optimizer_lr(trainer.optimizers))
        if data_time is not None:
            metrics["data_time"] = data_time
        if samples:  # all the step's micro-batches (accumulation)
            monitor.batch_size = samples / max(1, step - previous)
        monitor.log(step, epoch=trainer.current_epoch, **metrics)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_epoch(trainer, "train epoch end")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log_epoch(trainer, "validation end")

    def _log_epoch(self, trainer: pl.Trainer, what: str) -> None:
        if self._monitor is None:
            return
        try:
            values = plain_metrics(logged_values(trainer, on_step=False), OWN_NAMES)
            if values:
                self._monitor.log(trainer.global_step, epoch=trainer.current_epoch, **values)
        except Exception:
            self._warn(what, "%s failed", what, exc_info=True)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self._monitor is None:
            return
        try:
            monitor, self._monitor = self._monitor, None
            # The Monitor's own exit records the crash (a KeyboardInterrupt as an interrupt).
            monitor.__exit__(type(exception), exception, exception.__traceback__)
        except Exception:
            self._warn("crash", "recording the exception failed: %s", traceback.format_exc())

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self._owns and self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            monitor.close()
