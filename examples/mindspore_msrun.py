"""A tiny data-parallel MindSpore job watched by rankwatch (the lines marked ``# rankwatch``).

Run it on 4 ranks of one machine (CPU is enough)::

    msrun --worker_num=4 --local_worker_num=4 --master_port=8118 --log_dir=msrun_logs \\
        --join=True examples/mindspore_msrun.py

or as a single process with ``python examples/mindspore_msrun.py``. msrun must find the Python
that has MindSpore and rankwatch on ``PATH`` (activate the virtual environment first).

Each rank writes ``rankwatch_logs/<run>/rank<k>.jsonl`` and, when an aggregator listens
(``rankwatch serve`` on the head node, or ``RANKWATCH_ADDR=host:port``), streams to it live.
The run name is derived from the launch, the same on every rank (or set ``RANKWATCH_RUN``).
"""

from __future__ import annotations

import os

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_rank, init
from mindspore.context import ParallelMode
from rankwatch.agent.mindspore import GradNormTrainOneStepCell, TrainMonitor  # rankwatch

FEATURES, CLASSES, HIDDEN = 16, 5, 64
BATCH_PER_RANK = 32
STEPS_PER_EPOCH = 50
EPOCHS = 2


def shard(rank: int) -> ms.dataset.Dataset:
    """This rank's synthetic data: a fixed random teacher labels Gaussian inputs."""
    teacher = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
    rng = np.random.default_rng(1 + rank)
    x = rng.normal(size=(STEPS_PER_EPOCH * BATCH_PER_RANK, FEATURES)).astype(np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    data = ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False)
    return data.batch(BATCH_PER_RANK)


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    rank = 0
    if "MS_ROLE" in os.environ:  # launched by msrun
        init()  # the msrun scheduler process stays in here
        ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
        rank = get_rank()
    ms.set_seed(0)  # the same initial weights on every rank

    net = nn.SequentialCell(nn.Dense(FEATURES, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, CLASSES))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    # Also returns this rank's gradient norm before the all-reduce: a bad rank stands out.
    train_net = GradNormTrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)  # rankwatch
    model = ms.train.Model(train_net)
    callbacks = [TrainMonitor()]  # rankwatch
    model.train(EPOCHS, shard(rank), callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}: trained {EPOCHS * STEPS_PER_EPOCH} steps", flush=True)


if __name__ == "__main__":
    main()
