"""A 2-rank data-parallel job through MindFormers' own pieces, for test_mindformers_msrun.py.

MindFormers 2.0.0 builds the callbacks from a YAML config with its registry (``build_callback``:
``MFLossMonitor``, ``TrainingStateMonitor`` and ``RankwatchMonitor``, which MindFormers' own
``auto_register`` loads from examples/mindformers_rankwatch.py in ``REGISTER_PATH``, as
``run_mindformer.py --register_path`` users have it), orders them as its trainer
does (``BaseTrainer.sort_callbacks``) and trains through its train cell ``MFTrainOneStepCell``
(loss, overflow, loss scale, lr, global norm, per-group local square sums, sizes), with
MindFormers' ``CrossEntropyLoss`` accumulating each card's local loss. The model is a linear
softmax classifier whose start weights, data and SGD steps the test replays in numpy: see
``plan()``, shared with the test. Run under msrun; ``RANKWATCH_MINDFORMERS_PATH`` names the
folder MindFormers and its dependencies were installed into (deploy/dev-setup.sh).

Two things stand in for what this machine cannot have, and only those:
- ``hyper_parallel`` (MindFormers' dependency for its PyNative models, not on PyPI) is an empty
  module: MindFormers imports it when its package loads, and nothing used here calls it.
- MindSpore's overflow check in ``TrainOneStepWithLossScaleCell`` has no CPU kernel
  (``NPUGetFloatStatusV2`` / ``FloatStatus``); ``get_overflow_status`` is the same check from
  ops that have one (any non-finite gradient on any rank, all-reduced).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

import numpy as np

FEATURES = 4
CLASSES = 3
BATCH = 8
STEPS = 8
LR = 0.05
MAX_GRAD_NORM = 1e6  # clipping never changes the gradients: the test replays plain SGD
SPIKE_THRESHOLD = 10.0
SPIKE_STEP = 4  # every rank's inputs x30: a global-norm spike, skipped by the train cell
OVERFLOW_STEP = 6  # rank 1's inputs hold a NaN: an overflow, every rank skips the update
BAD_RANK = 1  # corrupted data (see plan): its local loss and gradient norm stand out

CONFIG_YAML = f"""\
callbacks:
  - type: MFLossMonitor
    per_print_times: 1
  - type: RankwatchMonitor
    auto_register: mindformers_rankwatch.RankwatchMonitor
  - type: TrainingStateMonitor
    origin_epochs: 1
    dataset_size: {STEPS}
    step_interval: 1
    use_skip_data_by_global_norm: True
    config:
      weight_state_format: log
      device_local_loss_format: log
      global_norm_spike_threshold: {SPIKE_THRESHOLD}
"""


def plan(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start weight (C, F), start bias (C,), inputs (steps, batch, F), labels (steps, batch))
    of ``rank``: float32 and int32."""
    weight = np.linspace(-0.5, 0.5, CLASSES * FEATURES, dtype=np.float32).reshape(CLASSES, -1)
    bias = np.zeros(CLASSES, dtype=np.float32)
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(STEPS, BATCH, FEATURES)).astype(np.float32)
    true_weight = np.eye(CLASSES, FEATURES, dtype=np.float32)
    y = np.argmax(x @ true_weight.T, axis=-1).astype(np.int32)
    if rank == BAD_RANK:  # corrupted: labels shifted by one class, inputs 3x as large
        y = (y + 1) % CLASSES
        x *= 3.0
    x[SPIKE_STEP - 1] *= 30.0
    if rank == BAD_RANK:
        x[OVERFLOW_STEP - 1, 0, 0] = np.nan
    return weight, bias, x, y


class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``hyper_parallel`` and its submodules as modules whose every name is an empty class."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "hyper_parallel" or name.startswith("hyper_parallel."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda self, *a, **k: None})

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def main() -> None:
    # After the venv's own packages: they win wherever both folders have a package.
    sys.path.append(os.environ["RANKWATCH_MINDFORMERS_PATH"])
    sys.meta_path.append(_EmptyModules())

    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.communication import get_rank, init
    from mindspore.context import ParallelMode

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    from mindformers.core.context.build_context import Context, set_context
    from mindformers.tools.register import MindFormerConfig

    # What monitor_config's device_local_loss_format turns on in MindFormers' trainer: the loss
    # accumulates this card's local loss for TrainingStateMonitor.
    Context(MindFormerConfig(context={"mode": 0, "device_target": "CPU"}, use_parallel=False))
    set_context(monitor_device_local_loss=True)
    init()  # the msrun scheduler process stays in here
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()

    from mindformers.core.callback import build_callback
    from mindformers.parallel_core.training_graph.loss_func import CrossEntropyLoss
    from mindformers.trainer.base_trainer import BaseTrainer
    from mindformers.wrapper import MFTrainOneStepCell

    not_finite = ops.MultitypeFuncGraph("not_finite")

    @not_finite.register("Tensor")
    def _not_finite(grad: Any) -> Any:
        return ops.logical_not(ops.isfinite(grad)).astype(ms.float32).sum()

    class CpuTrainOneStepCell(MFTrainOneStepCell):
        def get_overflow_status(self, status: Any, compute_output: Any) -> Any:
            flag = ops.addn(self.hyper_map(not_finite, compute_output))
            if self.is_distributed:
                flag = self.allreduce(flag)
            return flag > 0

    class Classifier(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Dense(FEATURES, CLASSES)
            self.loss = CrossEntropyLoss()

        def construct(self, x: Any, y: Any) -> Any:
            return self.loss(self.fc(x), y, ops.ones_like(y).astype(ms.float32))

    weight, bias, x, y = plan(rank)
    net = Classifier()
    net.fc.weight.set_data(Tensor(weight))
    net.fc.bias.set_data(Tensor(bias))
    optimizer = nn.SGD(net.trainable_params(), learning_rate=LR)
    train_net = CpuTrainOneStepCell(
        net, optimizer, use_clip_grad=True, max_grad_norm=MAX_GRAD_NORM, scale_sense=1.0,
        local_norm=True, use_skip_data_by_global_norm=True,
        global_norm_spike_threshold=SPIKE_THRESHOLD,
    )  # fmt: skip

    with open("mindformers_config.yaml", "w", encoding="utf-8") as f:
        f.write(CONFIG_YAML)
    config = MindFormerConfig("mindformers_config.yaml")
    loss_args = {
        "learning_rate": optimizer.learning_rate,
        "origin_epochs": 1,
        "dataset_size": STEPS,
        "global_batch_size": BATCH * 2,
    }
    callbacks = BaseTrainer.sort_callbacks(build_callback(config.callbacks, default_args=loss_args))
    names = [type(cb).__name__ for cb in callbacks]
    assert names == ["MFLossMonitor", "TrainingStateMonitor", "RankwatchMonitor"], names
    # MindFormers imported the example from REGISTER_PATH, as run_mindformer.py users have it.
    from rankwatch.agent.mindformers import REGISTERED, RankwatchMonitor

    assert REGISTERED and type(callbacks[2]) is RankwatchMonitor

    data = ms.dataset.NumpySlicesDataset(
        {"x": x.reshape(-1, FEATURES), "y": y.reshape(-1)}, shuffle=False
    ).batch(BATCH)
    ms.train.Model(train_net).train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
