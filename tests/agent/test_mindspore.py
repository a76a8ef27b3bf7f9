"""TrainMonitor with real MindSpore training on CPU (PyNative): what lands in the JSONL file.

Expected values are computed independently: losses, gradients and the lr actually applied come
from a NumPy re-implementation of the tiny network, fed the weights and batch of each step.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankwatch.agent.wire import records

pytestmark = pytest.mark.mindspore
ms = pytest.importorskip("mindspore", reason="MindSpore is not installed")

from mindspore import Tensor, nn, ops  # noqa: E402
from mindspore.common import dtype as mstype  # noqa: E402
from mindspore.train import Callback, Model, RunContext  # noqa: E402
from mindspore.train.callback import _InternalCallbackParam  # noqa: E402
from rankwatch.agent.mindspore import (  # noqa: E402
    GradNormTrainOneStepCell,
    TrainMonitor,
    output_metrics,
)
from rankwatch.agent.monitor import Monitor  # noqa: E402

FEATURES, CLASSES, BATCH, BATCHES = 4, 3, 8, 4  # 4 steps per epoch
REG = 0.1  # weight of the auxiliary loss of the multi-part networks
REL = 1e-5  # float32 network vs float64 NumPy reference


# --- a tiny classifier and its NumPy twin ---------------------------------------------------


class Classifier(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(FEATURES, CLASSES)
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def parts(self, x: Any, y: Any) -> tuple[Any, Any]:
        logits = self.fc(x)
        return self.ce(logits, y), REG * ops.reduce_mean(logits * logits)


class TupleLoss(Classifier):
    def construct(self, x: Any, y: Any) -> Any:
        return self.parts(x, y)


class DictLoss(Classifier):
    def construct(self, x: Any, y: Any) -> Any:
        ce, reg = self.parts(x, y)
        return {"ce": ce, "reg": reg}


class ScalarLoss(Classifier):
    def construct(self, x: Any, y: Any) -> Any:
        return self.parts(x, y)[0]


class FiniteCheckLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """The Ascend loss-scale cell with an overflow check that runs on CPU."""

    def get_overflow_status(self, status: Any, compute_output: Any) -> Any:
        bad = [
            ops.cast(ops.logical_not(ops.isfinite(g).all()), mstype.float32) for g in compute_output
        ]
        return ops.addn(bad) > 0


def numpy_step(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Losses and gradients (of the cross-entropy, and of the sum of both losses)."""
    w, b, x = w.astype(np.float64), b.astype(np.float64), x.astype(np.float64)
    logits = x @ w.T + b
    shifted = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    ce = float(-np.log(prob[np.arange(len(y)), y]).mean())
    g = prob.copy()
    g[np.arange(len(y)), y] -= 1.0
    g /= len(y)
    g_all = g + REG * 2.0 * logits / logits.size  # with the auxiliary loss's gradient
    return {
        "ce": ce,
        "reg": REG * float((logits**2).mean()),
        "dw": g.T @ x,
        "db": g.sum(axis=0),
        "dw_all": g_all.T @ x,
        "db_all": g_all.sum(axis=0),
    }


class Reference(Callback):
    """Per step: the NumPy reference at step begin, the weights at step end."""

    def __init__(self, fc: nn.Dense) -> None:
        self.fc = fc
        self.before: list[dict[str, Any]] = []
        self.after: list[tuple[np.ndarray, np.ndarray]] = []

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        return self.fc.weight.asnumpy().copy(), self.fc.bias.asnumpy().copy()

    def on_train_step_begin(self, run_context: RunContext) -> None:
        x, y = (t.asnumpy() for t in run_context.original_args().train_dataset_element)
        w, b = self.weights()
        self.before.append({**numpy_step(w, b, x, y), "w": w, "b": b})

    def on_train_step_end(self, run_context: RunContext) -> None:
        self.after.append(self.weights())

    def lr_used(self, i: int, summed: bool = False) -> tuple[float, float]:
        """(weight lr, bias lr) plain SGD applied at step i+1: -Δw / grad.

        ``summed``: the network returned both losses, so the gradient is of their sum."""
        ref, (w, b) = self.before[i], self.after[i]
        dw, db = (ref["dw_all"], ref["db_all"]) if summed else (ref["dw"], ref["db"])
        lr_w = -(w - ref["w"]).astype(np.float64).ravel() @ dw.ravel()
        lr_b = -(b - ref["b"]).astype(np.float64) @ db
        return lr_w / (dw**2).sum(), lr_b / (db**2).sum()


def dataset(seed: int = 0, batches: int = BATCHES) -> Any:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH * batches, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH * batches).astype(np.int32)
    return ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def read(path: Path) -> list[records.Record]:
    return [records.from_json_line(line) for line in path.read_text().splitlines()]


def steps_of(recs: list[records.Record]) -> list[records.StepRecord]:
    return [r for r in recs if isinstance(r, records.StepRecord)]


def events_of(recs: list[records.Record]) -> list[tuple[str, Any]]:
    return [(r.event, r.info.get("reason")) for r in recs if isinstance(r, records.EventRecord)]


def train(
    tmp_path: Path,
    network: nn.Cell,
    *,
    epochs: int = 1,
    lr: Any = 0.1,
    cell: Any = nn.TrainOneStepCell,
    params: Any = None,
    callbacks: tuple[Callback, ...] = (),
    **monitor_args: Any,
) -> tuple[list[records.StepRecord], Reference, TrainMonitor]:
    """Train ``network`` with plain SGD and a TrainMonitor writing JSONL only."""
    optimizer = nn.SGD(params or network.trainable_params(), learning_rate=lr)
    if cell is None:  # Model builds the train network from loss_fn and optimizer
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        model = Model(network.fc, loss_fn, optimizer)
    else:
        model = Model(cell(network, optimizer))
    monitor = TrainMonitor(run="t", log_dir=str(tmp_path), **monitor_args)
    reference = Reference(network.fc)
    model.train(epochs, dataset(), callbacks=[reference, monitor, *callbacks])
    return steps_of(read(tmp_path / "t" / "rank0.jsonl")), reference, monitor


# --- network outputs ------------------------------------------------------------------------


def test_scalar_loss_across_two_epochs(tmp_path: Path) -> None:
    steps, ref, monitor = train(tmp_path, Classifier(), epochs=2, cell=None)
    assert [s.step for s in steps] == list(range(1, 2 * BATCHES + 1))
    assert [s.epoch for s in steps] == [1] * BATCHES + [2] * BATCHES
    for s, expected in zip(steps, ref.before, strict=True):
        assert s.metrics["loss"] == pytest.approx(expected["ce"], rel=REL)
    assert monitor.monitor.batch_size == BATCH  # from train_dataset.get_batch_size()
    assert all("throughput" in s.metrics for s in steps[1:])
    # Host time between steps: from the second step on, small and non-negative.
    assert "data_time" not in steps[0].metrics
    assert all(0.0 <= s.metrics["data_time"] < 1.0 for s in steps[1:])
    events = events_of(read(tmp_path / "t" / "rank0.jsonl"))
    assert events == [("start", None), ("end", "normal")]


def test_tuple_output_total_is_the_sum(tmp_path: Path) -> None:
    steps, ref, _ = train(tmp_path, TupleLoss())
    assert len(steps) == BATCHES
    for s, expected in zip(steps, ref.before, strict=True):
        names = {k for k in s.metrics if k.startswith("loss")}
        assert names == {"loss", "loss/0", "loss/1"}
        assert s.metrics["loss/0"] == pytest.approx(expected["ce"], rel=REL)
        assert s.metrics["loss/1"] == pytest.approx(expected["reg"], rel=REL)
        assert s.metrics["loss"] == pytest.approx(expected["ce"] + expected["reg"], rel=REL)
    # ... because the SUM is what TrainOneStepCell back-propagated (SGD, lr 0.1):
    applied = [ref.lr_used(i, summed=True)[0] for i in range(BATCHES)]
    assert applied == pytest.approx([0.1] * BATCHES)


def test_dict_output_total_is_the_sum(tmp_path: Path) -> None:
    steps, ref, _ = train(tmp_path, DictLoss())
    assert len(steps) == BATCHES
    for s, expected in zip(steps, ref.before, strict=True):
        assert s.metrics["loss/ce"] == pytest.approx(expected["ce"], rel=REL)
        assert s.metrics["loss/reg"] == pytest.approx(expected["reg"], rel=REL)
        assert s.metrics["loss"] == pytest.approx(expected["ce"] + expected["reg"], rel=REL)


def test_explicit_outputs_override_detection(tmp_path: Path) -> None:
    steps, ref, _ = train(tmp_path, TupleLoss(), outputs=("ce", None))
    for s, expected in zip(steps, ref.before, strict=True):
        timing = ("step_time", "throughput", "data_time", "lr")
        assert {k for k in s.metrics if k not in timing} == {"ce"}
        assert s.metrics["ce"] == pytest.approx(expected["ce"], rel=REL)


def loss_scale_cell(scale: float) -> Any:
    return lambda net, opt: FiniteCheckLossScaleCell(net, opt, Tensor(scale, mstype.float32))


def test_loss_scale_tuple_is_not_summed(tmp_path: Path) -> None:
    steps, ref, _ = train(tmp_path / "ok", ScalarLoss(), cell=loss_scale_cell(1024.0))
    for s, expected in zip(steps, ref.before, strict=True):
        assert not any(k.startswith("loss/") for k in s.metrics)
        assert s.metrics["loss"] == pytest.approx(expected["ce"], rel=REL)
        assert s.metrics["overflow"] == 0.0
        assert s.metrics["loss_scale"] == 1024.0
    # An infinite scale overflows every step: flagged, and the optimizer skips the update.
    steps, ref, _ = train(tmp_path / "inf", ScalarLoss(), cell=loss_scale_cell(math.inf))
    assert [s.metrics["overflow"] for s in steps] == [1.0] * BATCHES
    assert all(s.metrics["loss_scale"] == math.inf for s in steps)
    assert np.array_equal(ref.after[-1][0], ref.before[0]["w"])


def test_grad_norm_cell_records_the_local_norm(tmp_path: Path) -> None:
    def cell(net: nn.Cell, opt: nn.Optimizer) -> nn.Cell:
        return GradNormTrainOneStepCell(net, opt)

    steps, ref, _ = train(tmp_path, ScalarLoss(), cell=cell)
    assert len(steps) == BATCHES
    for s, expected in zip(steps, ref.before, strict=True):
        norm = math.sqrt((expected["dw"] ** 2).sum() + (expected["db"] ** 2).sum())
        assert s.metrics["grad_norm_local"] == pytest.approx(norm, rel=1e-4)
        assert s.metrics["loss"] == pytest.approx(expected["ce"], rel=REL)


# --- learning rate --------------------------------------------------------------------------

LR_LIST = [0.1, 0.09, 0.08, 0.07, 0.05, 0.03, 0.02, 0.01]  # one per step of 2 epochs


def cosine(step_index: int) -> float:  # nn.CosineDecayLR(0.01, 0.1, 6)
    return 0.01 + 0.5 * (0.1 - 0.01) * (1 + math.cos(math.pi * min(step_index, 6) / 6))


@pytest.mark.parametrize(
    ("lr", "expected"),
    [
        (0.05, lambda i: 0.05),
        ("cosine", cosine),
        (LR_LIST, lambda i: LR_LIST[i]),  # the last step is where optimizer.get_lr() raises
    ],
    ids=["constant", "cosine", "list"],
)
def test_lr_is_the_rate_used_for_the_step(tmp_path: Path, lr: Any, expected: Any) -> None:
    schedule = nn.CosineDecayLR(0.01, 0.1, 6) if lr == "cosine" else lr
    steps, ref, _ = train(tmp_path, ScalarLoss(), epochs=2, lr=schedule)
    assert len(steps) == 2 * BATCHES
    for i, s in enumerate(steps):
        assert s.metrics["lr"] == pytest.approx(expected(i), rel=1e-6)
        assert s.metrics["lr"] == pytest.approx(ref.lr_used(i)[0], rel=1e-3)


@pytest.fixture
def graph_mode() -> Any:
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_graph_mode_schedule_and_loss_parts(tmp_path: Path, graph_mode: None) -> None:
    schedule = nn.CosineDecayLR(0.01, 0.1, 6)
    steps, ref, _ = train(tmp_path, TupleLoss(), epochs=2, lr=schedule)
    assert len(steps) == 2 * BATCHES
    for i, s in enumerate(steps):
        assert s.metrics["lr"] == pytest.approx(cosine(i), rel=1e-6)
        assert s.metrics["lr"] == pytest.approx(ref.lr_used(i, summed=True)[0], rel=1e-3)
        expected = ref.before[i]["ce"] + ref.before[i]["reg"]
        assert s.metrics["loss"] == pytest.approx(expected, rel=REL)


def test_group_lr_one_series_per_group(tmp_path: Path) -> None:
    net = ScalarLoss()
    groups = [{"params": [net.fc.weight], "lr": 0.2}, {"params": [net.fc.bias]}]
    steps, ref, _ = train(tmp_path, net, lr=[0.05, 0.04, 0.03, 0.02], cell=None, params=groups)
    for i, s in enumerate(steps):
        lr_w, lr_b = ref.lr_used(i)
        assert s.metrics["lr/0"] == s.metrics["lr"] == pytest.approx(0.2, rel=1e-6)
        assert s.metrics["lr/1"] == pytest.approx([0.05, 0.04, 0.03, 0.02][i], rel=1e-6)
        assert (lr_w, lr_b) == pytest.approx((s.metrics["lr/0"], s.metrics["lr/1"]), rel=1e-3)


def test_lr_interval(tmp_path: Path) -> None:
    steps, _, _ = train(tmp_path / "3", ScalarLoss(), epochs=2, lr_interval=3)
    assert [s.step for s in steps if "lr" in s.metrics] == [3, 6]
    steps, _, _ = train(tmp_path / "0", ScalarLoss(), lr_interval=0)
    assert not any("lr" in s.metrics for s in steps)


# --- steps, crashes, weights ----------------------------------------------------------------


def test_second_train_call_continues_the_step_count(tmp_path: Path) -> None:
    net = ScalarLoss()
    model = Model(nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1)))
    monitor = TrainMonitor(run="t", log_dir=str(tmp_path))  # owns its Monitor
    model.train(1, dataset(), callbacks=[monitor])
    model.train(2, dataset(), callbacks=[monitor])
    recs = read(tmp_path / "t" / "rank0.jsonl")
    assert [s.step for s in steps_of(recs)] == list(range(1, 3 * BATCHES + 1))
    assert [s.epoch for s in steps_of(recs)] == [1] * BATCHES * 2 + [2] * BATCHES
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    # Each train() closes the Monitor it made; the next one continues the same run.
    assert events_of(recs) == [("start", None), ("end", "normal")] * 2


def test_given_monitor_is_left_open(tmp_path: Path) -> None:
    mon = Monitor(run="t", log_dir=tmp_path)
    net = ScalarLoss()
    model = Model(nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1)))
    callback = TrainMonitor(mon)
    model.train(1, dataset(), callbacks=[callback])
    model.train(1, dataset(), callbacks=[callback])
    mon.log(100, note=1.0)  # still open: the caller closes it
    mon.close()
    recs = read(mon.jsonl_path)
    assert [s.step for s in steps_of(recs)] == [*range(1, 2 * BATCHES + 1), 100]
    assert events_of(recs) == [("start", None), ("end", "normal")]


def test_telemetry_and_ckpt_dir_reach_the_monitor_it_makes(tmp_path: Path) -> None:
    callback = TrainMonitor(run="t", log_dir=str(tmp_path), telemetry="host,30s", ckpt_dir="c")
    mon = callback.monitor
    assert mon._sampler is not None and mon._sampler.registry.names() == ["host"]
    (host,) = mon._sampler.registry.sources()
    assert host.interval_s == 30.0 and host._dirs["ckpt"] == Path("c").absolute()
    mon.close()
    given = Monitor(run="u", log_dir=tmp_path)
    with pytest.raises(ValueError, match="telemetry/ckpt_dir"):
        TrainMonitor(given, telemetry="off")
    given.close()


class Bomb(Callback):
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_step_begin(self, run_context: RunContext) -> None:
        if run_context.original_args().cur_step_num == self.at_step:
            raise RuntimeError(f"injected fault at step {self.at_step}")


def test_crash_is_recorded(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="injected fault"):
        train(tmp_path, ScalarLoss(), epochs=2, callbacks=(Bomb(6),))
    recs = read(tmp_path / "t" / "rank0.jsonl")
    assert [s.step for s in steps_of(recs)] == [1, 2, 3, 4, 5]
    crashes = [r for r in recs if isinstance(r, records.EventRecord) and r.event == "crash"]
    assert len(crashes) == 1
    crash = crashes[0]
    assert crash.step == 5  # the last step completed
    assert crash.info["exc_type"] == "builtins.RuntimeError"
    assert crash.info["message"] == "injected fault at step 6"
    assert "on_train_step_begin" in crash.info["traceback"]
    assert crash.info["traceback"].endswith("RuntimeError: injected fault at step 6\n")
    assert events_of(recs) == [("start", None), ("crash", None)]  # no "end" after a crash
    assert recs[-1].seq == max(r.seq for r in recs)  # nothing written after closing


def test_update_ratio_and_weight_stats(tmp_path: Path) -> None:
    steps, ref, _ = train(
        tmp_path,
        ScalarLoss(),
        epochs=2,
        update_ratio_interval=3,
        weight_stats_layers=("fc.weight", "fc"),
        weight_stats_interval=2,
    )
    by_step = {s.step: s.metrics for s in steps}
    assert [s.step for s in steps if "update_ratio" in s.metrics] == [3, 6]
    for step in (3, 6):
        (w0, b0), (w1, b1) = ref.after[step - 2], ref.after[step - 1]
        delta = np.sqrt(((w1 - w0) ** 2).sum() + ((b1 - b0) ** 2).sum())
        expected = delta / np.sqrt((w1.astype(np.float64) ** 2).sum() + (b1**2).sum())
        assert by_step[step]["update_ratio"] == pytest.approx(expected, rel=1e-4)
    assert [s.step for s in steps if "weights/fc/mean" in s.metrics] == [2, 4, 6, 8]
    for step in (2, 4, 6, 8):
        w, b = (a.astype(np.float64) for a in ref.after[step - 1])
        both = np.concatenate([w.ravel(), b])
        assert by_step[step]["weights/fc.weight/mean"] == pytest.approx(w.mean(), rel=1e-9)
        assert by_step[step]["weights/fc.weight/var"] == pytest.approx(w.var(), rel=1e-9)
        assert by_step[step]["weights/fc/mean"] == pytest.approx(both.mean(), rel=1e-9)
        assert by_step[step]["weights/fc/var"] == pytest.approx(both.var(), rel=1e-9)


def test_log_interval_keeps_each_epochs_last_step(tmp_path: Path) -> None:
    steps, ref, _ = train(tmp_path, ScalarLoss(), epochs=2, log_interval=3)
    assert [s.step for s in steps] == [3, 4, 6, 8]  # 4 and 8 end an epoch
    for s in steps:
        assert s.metrics["loss"] == pytest.approx(ref.before[s.step - 1]["ce"], rel=REL)


def test_sink_mode_records_the_real_step_numbers(tmp_path: Path) -> None:
    # On Ascend, step end fires once per sink of 4 steps; CPU cannot sink, so the hooks are
    # driven here as Model drives them, with real MindSpore callback objects.
    monitor = TrainMonitor(run="t", log_dir=str(tmp_path), log_interval=10)
    cb_params = _InternalCallbackParam()
    cb_params.cur_step_num = 0
    cb_params.cur_epoch_num = 1
    cb_params.dataset_sink_mode = True
    context = RunContext(cb_params)
    monitor.on_train_begin(context)
    for step in range(4, 33, 4):
        cb_params.cur_step_num = step
        cb_params.net_outputs = Tensor(1.0 / step, mstype.float32)
        monitor.on_train_step_end(context)
    monitor.on_train_end(context)
    steps = steps_of(read(tmp_path / "t" / "rank0.jsonl"))
    assert [s.step for s in steps] == [12, 20, 32]  # each first step end past 10, 20, 30
    assert [s.metrics["loss"] for s in steps] == pytest.approx([1 / 12, 1 / 20, 1 / 32])


def test_fit_validation_results_become_an_eval_event(tmp_path: Path) -> None:
    net = ScalarLoss()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.SGD(net.fc.trainable_params(), 0.1)
    model = Model(net.fc, loss_fn, optimizer, metrics={"acc": nn.Accuracy()})
    model.fit(
        1, dataset(), dataset(seed=1), callbacks=[TrainMonitor(run="t", log_dir=str(tmp_path))]
    )
    evals = [r for r in read(tmp_path / "t" / "rank0.jsonl") if getattr(r, "event", "") == "eval"]
    assert len(evals) == 1
    assert evals[0].step == BATCHES and evals[0].info["epoch"] == 1
    assert evals[0].info["acc"] == pytest.approx(model.eval(dataset(seed=1))["acc"])


def test_bad_address_leaves_training_unharmed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    net = ScalarLoss()
    model = Model(nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1)))
    reference = Reference(net.fc)
    callback = TrainMonitor(run="t", log_dir=str(tmp_path), addr="tcp://127.0.0.1:notaport")
    model.train(1, dataset(), callbacks=[reference, callback])
    assert len(reference.after) == BATCHES  # trained every step
    assert "training continues unmonitored" in caplog.text
    assert "notaport" in caplog.text  # the Monitor's own message says what was wrong


# --- pure parts -----------------------------------------------------------------------------


def t(value: Any, dtype: Any = mstype.float32) -> Tensor:
    return Tensor(np.asarray(value), dtype)


@pytest.mark.parametrize(
    ("outputs", "names", "expected"),
    [
        (t(1.5), None, {"loss": 1.5}),
        (2.0, None, {"loss": 2.0}),
        ([t(1.5)], None, {"loss": 1.5}),
        ((t(1.0), t(2.0)), None, {"loss": 3.0, "loss/0": 1.0, "loss/1": 2.0}),
        (
            {"a": t(1.0), "b": {"c": t(2.0), "d": (t(0.5), t(0.25))}},
            None,
            {"loss": 3.75, "loss/a": 1.0, "loss/b.c": 2.0, "loss/b.d.0": 0.5, "loss/b.d.1": 0.25},
        ),
        (
            (t(1.0), t(False, mstype.bool_), t(1024.0)),
            None,
            {"loss": 1.0, "overflow": 0.0, "loss_scale": 1024.0},
        ),
        (  # MindFormers: lr, global norm, per-group local norms and their sizes
            (t(1.0), t(True, mstype.bool_), t(512.0), t(1e-4), t(3.0), t([1.0, 2.0]), t([5, 6])),
            None,
            {
                "loss": 1.0,
                "overflow": 1.0,
                "loss_scale": 512.0,
                "lr": pytest.approx(1e-4),
                "grad_norm": 3.0,
                "grad_norm_local/0": 1.0,
                "grad_norm_local/1": 2.0,
                "norm_size/0": 5.0,
                "norm_size/1": 6.0,
            },
        ),
        ((t(1.0), t(np.ones((8, 8)))), None, {"loss": 1.0}),  # too big to record
        ((t(1.0), t(0.25)), ("loss", "grad_norm_local"), {"loss": 1.0, "grad_norm_local": 0.25}),
        ((t(1.0), t(0.25)), ("loss",), {"loss": 1.0}),
        (t(1.0), ("total",), {"total": 1.0}),
        (t(2.5, mstype.bfloat16), None, {"loss": 2.5}),
        ((t(1.0), "text", None), None, {"loss": 1.0}),
    ],
)
def test_output_metrics(outputs: Any, names: Any, expected: dict[str, Any]) -> None:
    assert output_metrics(outputs, names) == expected


def test_output_metrics_keeps_nan_and_reports_skipped() -> None:
    skipped: list[str] = []
    got = output_metrics((t(math.nan), t(1.0), t(np.zeros(100))), skipped=skipped)
    assert math.isnan(got["loss"]) and math.isnan(got["loss/0"]) and got["loss/1"] == 1.0
    assert skipped == ["loss/2 (shape (100,))"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"log_interval": 0}, "log_interval must be an int >= 1"),
        ({"lr_interval": -1}, "lr_interval must be an int >= 0"),
        ({"update_ratio_interval": 1.5}, "update_ratio_interval must be an int"),
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"outputs": ("loss", "step")}, "'step' is reserved"),
        ({"outputs": ("loss", 3)}, "outputs names must be strings"),
        ({"weight_stats_layers": ("fc", "")}, "parameter-name prefixes"),
        ({"monitor": object(), "run": "x"}, "either a Monitor or run"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainMonitor(**kwargs)


def test_rankwatch_agent_does_not_import_mindspore() -> None:
    code = "import sys, rankwatch.agent; print('mindspore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
