"""A tiny data-parallel MindSpore job for tests/agent/test_msrun.py (run it under msrun).

Every rank trains the same MLP on its own shard of synthetic data with the gradients
all-reduced; ``TrainMonitor`` records each rank (run name, rank and aggregator address come
from the environment). Usage: ``msrun ... dp_train.py [steps] [epochs]``.
"""

from __future__ import annotations

import sys

import numpy as np

FEATURES = 8
CLASSES = 3
BATCH = 16


def main(steps: int, epochs: int) -> None:
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_rank, init
    from mindspore.context import ParallelMode

    ms.set_context(mode=ms.GRAPH_MODE)
    init()  # the msrun scheduler process stays in here
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)  # same initial weights on every rank
    rank = get_rank()

    from rankwatch.agent.mindspore import GradNormTrainOneStepCell, TrainMonitor

    rng = np.random.default_rng(rank)  # each rank its own shard
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    data = ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, CLASSES))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    model = ms.train.Model(GradNormTrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer))
    model.train(epochs, data, callbacks=[TrainMonitor()], dataset_sink_mode=False)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
