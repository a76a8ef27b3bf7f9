"""The `rankwatch demo` training job: real MindSpore data parallelism with one rank going bad.

Launched by msrun (one process per rank plus a scheduler), e.g.::

    msrun --worker_num=4 --local_worker_num=4 --master_port=8118 --log_dir=msrun_logs \\
        --join=True train_mindspore.py --steps 300 --fault labels --fault-rank 2 --fault-step 20

A small MLP classifier (16 inputs, 5 classes) learns a fixed random teacher; every rank draws its
own shard, and gradients are all-reduced with ``gradients_mean=True``. From step ``--fault-step``
on, rank ``--fault-rank`` goes bad in one of these ways:

- ``labels``: its labels become ``(y + 1) % 5`` (a card whose data or arithmetic went wrong);
- ``nan``: an infinite input makes its loss NaN; the all-reduce spreads NaN to every rank one
  step later, so the question the monitor answers is which rank went first;
- ``slow``: it sleeps ``--slow-s`` extra per step (in synchronous data parallelism everyone waits);
- ``hang``: it sleeps forever at that step (all ranks stop progressing: health turns stalled);
- ``crash``: it raises at that step; msrun then kills the other ranks;
- ``sdc``: silent data corruption: its local gradients are scaled by ``1 + --sdc-eps`` before
  the all-reduce (``SdcTrainOneStepCell``). The loss hardly moves, since every rank applies the
  same averaged gradients; only the rank's own ``grad_norm_local`` shows it.

rankwatch takes the three lines marked ``# rankwatch`` (import, a train cell that also returns the
rank's own gradient norm, the callback); the run name and aggregator address come from the
environment (``RANKWATCH_RUN``, ``RANKWATCH_ADDR`` or the msrun scheduler host).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

FEATURES = 16
CLASSES = 5
BATCH_PER_RANK = 32
LEARNING_RATE = 0.05
SLOW_EXTRA_S = 0.5  # default extra sleep per step on the slow rank
HANG_SLEEP_S = 3600.0  # the hung rank sleeps in chunks of this forever
SDC_EPS = 0.5  # default relative gradient error of the sdc fault: flagged in a few steps
FAULTS = ("labels", "nan", "slow", "hang", "crash", "sdc", "none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--fault", choices=FAULTS, default="labels")
    parser.add_argument("--fault-rank", type=int, default=2)
    parser.add_argument("--fault-step", type=int, default=20, help="first bad step (1-based)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to watch")
    parser.add_argument("--slow-s", type=float, default=SLOW_EXTRA_S)
    parser.add_argument(
        "--sdc-eps", type=float, default=SDC_EPS,
        help=f"sdc: the bad rank's local gradients are scaled by 1 + EPS (default {SDC_EPS})",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.fault_step < 1:
        parser.error(f"--fault-step must be >= 1, got {args.fault_step}")
    if not args.sdc_eps > -1:
        parser.error(f"--sdc-eps must be > -1 (a gradient factor 1 + EPS > 0), got {args.sdc_eps}")
    return args


class ShardSource:
    """One batch per index: rank ``rank``'s shard of a fixed teacher's labelled data.

    Random access keyed by the batch index keeps the data (and the injected fault) identical
    whatever MindSpore's prefetching does.
    """

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args = args
        self.rank = rank
        self.teacher = np.random.default_rng(args.seed).normal(size=(FEATURES, CLASSES))

    def __len__(self) -> int:
        return int(self.args.steps)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng((self.args.seed, self.rank, index))
        x = rng.normal(size=(BATCH_PER_RANK, FEATURES)).astype(np.float32)
        y = np.argmax(x @ self.teacher, axis=1).astype(np.int32)
        step = index + 1
        if self.rank == self.args.fault_rank and step >= self.args.fault_step:
            if self.args.fault == "labels":
                y = (y + 1) % CLASSES
            elif self.args.fault == "nan":
                x[0, 0] = np.inf
        return x, y


def sdc_train_cell(network: Any, optimizer: Any) -> Any:
    """A ``GradNormTrainOneStepCell`` whose local gradients are multiplied by ``sdc_scale``
    (1 until the sdc fault sets it) before the local norm and the all-reduce: what a card
    computing slightly wrong gradients hands to its peers."""
    import mindspore as ms
    from mindspore import ops
    from rankwatch.agent.mindspore import GradNormTrainOneStepCell
    from rankwatch.agent.mindspore_cells import _square_sum

    scale_grad = ops.MultitypeFuncGraph("demo_sdc_scale")

    @scale_grad.register("Tensor", "Tensor")
    def _scale(factor: Any, grad: Any) -> Any:
        return grad * ops.cast(factor, grad.dtype)

    class SdcTrainOneStepCell(GradNormTrainOneStepCell):
        def __init__(self, network: Any, optimizer: Any) -> None:
            super().__init__(network, optimizer)
            # A Parameter, not a constant: GRAPH mode reads it on every step, so set_data
            # changes it without compiling the graph again.
            self.sdc_scale = ms.Parameter(
                ms.Tensor(1.0, ms.float32), name="sdc_scale", requires_grad=False
            )

        def construct(self, *inputs: Any) -> Any:
            loss = self.network(*inputs)
            sens = ops.fill(loss.dtype, loss.shape, self.sens)
            grads = self.grad(self.network, self.weights)(*inputs, sens)
            grads = self.hyper_map(ops.partial(scale_grad, self.sdc_scale), grads)
            squares = self.hyper_map(_square_sum, grads)
            grad_norm_local = ops.sqrt(ops.addn(squares)) / self.sens
            grads = self.grad_reducer(grads)
            loss = ops.depend(loss, self.optimizer(grads))
            return loss, grad_norm_local

    return SdcTrainOneStepCell(network, optimizer)


def fault_callback(args: argparse.Namespace, rank: int, train_net: Any = None) -> Any:
    """A callback that paces the steps and injects the step-level faults (slow, hang, crash)
    and, on ``train_net`` (an ``sdc_train_cell``), the gradient error of ``sdc``."""
    import mindspore as ms
    from mindspore.train import Callback

    class FaultInjector(Callback):
        def on_train_step_begin(self, run_context: Any) -> None:
            step = run_context.original_args().cur_step_num
            bad = rank == args.fault_rank and step >= args.fault_step
            if bad and args.fault == "sdc" and step == args.fault_step:
                print(f"rank {rank}: gradients x {1 + args.sdc_eps:g} from step {step}", flush=True)
                train_net.sdc_scale.set_data(ms.Tensor(1.0 + args.sdc_eps, ms.float32))
            if bad and args.fault == "crash":
                raise RuntimeError(f"injected fault: rank {rank} crashed at step {step}")
            if bad and args.fault == "hang" and step == args.fault_step:
                print(f"rank {rank}: injected hang at step {step}", flush=True)
                while True:
                    time.sleep(HANG_SLEEP_S)
            if bad and args.fault == "slow":
                time.sleep(args.slow_s)

        def on_train_step_end(self, run_context: Any) -> None:
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)

    return FaultInjector()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_rank, init
    from mindspore.context import ParallelMode

    ms.set_context(mode=ms.GRAPH_MODE)
    init()  # the msrun scheduler process stays in here; only workers go on
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(args.seed)  # identical initial weights on every rank
    rank = get_rank()

    from rankwatch.agent.mindspore import GradNormTrainOneStepCell, TrainMonitor  # rankwatch

    dataset = ms.dataset.GeneratorDataset(
        ShardSource(args, rank), column_names=["x", "y"], shuffle=False
    )
    net = nn.SequentialCell(nn.Dense(FEATURES, 64), nn.ReLU(), nn.Dense(64, CLASSES))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=LEARNING_RATE, momentum=0.9)
    # The local (pre-all-reduce) gradient norm is what tells a bad rank apart.
    train_net = GradNormTrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)  # rankwatch
    if args.fault == "sdc":  # the same cell, with the injected gradient error on every rank
        train_net = sdc_train_cell(nn.WithLossCell(net, loss_fn), optimizer)
    model = ms.train.Model(train_net)
    monitor = TrainMonitor(batch_size=BATCH_PER_RANK)  # rankwatch
    callbacks = [fault_callback(args, rank, train_net), monitor]
    model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}: trained {monitor.step} of {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
