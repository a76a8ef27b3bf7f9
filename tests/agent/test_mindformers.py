"""RankwatchMonitor without MindFormers in this process: its mapping of MindFormers' output tuple,
the counters and notes, driven through real MindSpore callback objects; what lands in the JSONL.

The real MindFormers registry, callbacks and train cell run in tests/e2e/test_mindformers_msrun.py.
The tuples here have the layout ``MFTrainOneStepCell`` returns in MindFormers 2.0.0
(mindformers/wrapper/wrapper.py, ``construct``: ``loss, overflow, scaling_sens, learning_rate,
global_norm[, local_norm, size]``), with the dtypes and shapes it returned on CPU: loss, overflow
(bool), loss scale and lr of shape (), global norm of shape (1,), ``local_norm`` one float32
square sum per gradient, ``size`` a tuple of ints.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankwatch.agent.wire import records

pytestmark = pytest.mark.mindspore
ms = pytest.importorskip("mindspore", reason="MindSpore is not installed")

from mindspore import Tensor, nn  # noqa: E402
from mindspore.common import dtype as mstype  # noqa: E402
from mindspore.train import RunContext  # noqa: E402
from mindspore.train.callback import _InternalCallbackParam  # noqa: E402
from rankwatch.agent import mindformers as mf  # noqa: E402
from rankwatch.agent.monitor import Monitor  # noqa: E402


def f32(value: Any) -> Tensor:
    return Tensor(np.asarray(value, dtype=np.float32))


def output(
    loss: float, overflow: bool = False, norm: float | None = 1.0, squares: Any = (1.0, 3.0)
) -> tuple[Any, ...]:
    """A MindFormers 2.0.0 7-tuple (see the module docstring)."""
    return (
        f32(loss), Tensor(overflow, mstype.bool_), f32(1024.0), f32(1e-3),
        None if norm is None else f32([norm]), f32(list(squares)), (4, 1),
    )  # fmt: skip


def read(path: Path) -> list[records.Record]:
    return [records.from_json_line(line) for line in path.read_text().splitlines() if line]


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (
            output(2.5, squares=(9.0, 16.0)),
            {"loss": 2.5, "overflow": 0.0, "loss_scale": 1024.0, "lr": 1e-3, "grad_norm": 1.0,
             "grad_norm_local": 5.0},
        ),  # local_norm holds square sums: the rank's norm is the root of their sum
        (output(1.0)[:5], {"loss": 1.0, "overflow": 0.0, "loss_scale": 1024.0, "lr": 1e-3,
                           "grad_norm": 1.0}),
        (output(1.0, norm=None)[:5], {"loss": 1.0, "overflow": 0.0, "loss_scale": 1024.0,
                                      "lr": 1e-3}),  # use_clip_grad=False: no global norm
        (output(1.0, overflow=True)[:3], {"loss": 1.0, "overflow": 1.0, "loss_scale": 1024.0}),
        ((f32([1.0, 3.0]), *output(0.0)[1:4]), {"loss": 2.0, "overflow": 0.0,
                                                "loss_scale": 1024.0, "lr": 1e-3}),  # the mean
        (f32(0.5), {"loss": 0.5}),  # not MindFormers' tuple: TrainMonitor's mapping
        ((f32(1.0), f32(2.0)), {"loss": 3.0, "loss/0": 1.0, "loss/1": 2.0}),
    ],
)  # fmt: skip
def test_mindformers_metrics(outputs: Any, expected: dict[str, float]) -> None:
    assert mf.mindformers_metrics(outputs) == pytest.approx(expected)


def test_inf_square_sum_keeps_the_rank_norm_non_finite() -> None:
    metrics = mf.mindformers_metrics(output(math.inf, True, math.inf, (math.inf, 1.0)))
    assert math.isinf(metrics["grad_norm_local"]) and math.isinf(metrics["loss"])


class _Cell(nn.Cell):
    """A train network as the callback sees it: MFTrainOneStepCell's skip settings."""

    def __init__(self, skip: bool, threshold: float) -> None:
        super().__init__()
        self.use_skip_data_by_global_norm = skip
        self.global_norm_spike_threshold = threshold


def drive(
    tmp_path: Path, outs: list[Any], network: Any = None, **kwargs: Any
) -> tuple[list[records.Record], mf.RankwatchMonitor]:
    """Run the hooks as Model.train runs them, one step end per output."""
    callback = mf.RankwatchMonitor(run="t", log_dir=str(tmp_path), **kwargs)
    cb_params = _InternalCallbackParam()
    cb_params.cur_step_num = 0
    cb_params.cur_epoch_num = 1
    cb_params.train_network = network
    cb_params.list_callback = [callback]
    context = RunContext(cb_params)
    callback.on_train_begin(context)
    for step, out in enumerate(outs, start=1):
        cb_params.cur_step_num = step
        cb_params.net_outputs = out
        callback.on_train_step_begin(context)
        callback.on_train_step_end(context)
    callback.on_train_epoch_end(context)
    callback.on_train_end(context)
    return read(tmp_path / "t" / "rank0.jsonl"), callback


def test_counters_see_every_step_and_spikes_are_notes(tmp_path: Path) -> None:
    outs = [
        output(1.0, norm=2.0),
        output(1.0, norm=50.0),  # spike: the cell skips the update
        output(math.inf, overflow=True, norm=math.inf),  # overflow (and an inf norm)
        output(1.0, norm=3.0),
        output(1.0, norm=4.0),
    ]
    recs, callback = drive(tmp_path, outs, _Cell(skip=True, threshold=10.0), log_interval=2)
    steps = {r.step: r.metrics for r in recs if isinstance(r, records.StepRecord)}
    assert sorted(steps) == [2, 4, 5]  # the interval, and the epoch's last step
    assert [steps[s]["skipped_steps"] for s in (2, 4, 5)] == [1.0, 2.0, 2.0]
    assert [steps[s]["grad_norm_spikes"] for s in (2, 4, 5)] == [1.0, 2.0, 2.0]
    assert steps[4]["grad_norm_local"] == pytest.approx(2.0)
    assert "lr" in steps[4] and steps[4]["lr"] == pytest.approx(1e-3)  # from the tuple
    notes = [r for r in recs if isinstance(r, records.EventRecord) and r.event == "note"]
    assert [(n.step, n.info["note"], n.info["skipped"]) for n in notes] == [
        (2, "grad_norm_spike", True),
        (3, "grad_norm_spike", False),  # the overflow skipped it, not the norm
    ]
    assert notes[0].info["grad_norm"] == 50.0 and notes[0].info["threshold"] == 10.0
    assert (callback.skipped_steps, callback.grad_norm_spikes) == (2, 2)


def test_threshold_argument_and_no_threshold(tmp_path: Path) -> None:
    outs = [output(1.0, norm=5.0), output(1.0, norm=20.0)]
    # The cell does not skip by norm: its threshold is not one the user asked for.
    recs, _ = drive(tmp_path / "a", outs, _Cell(skip=False, threshold=1.0))
    last = [r for r in recs if isinstance(r, records.StepRecord)][-1].metrics
    assert (last["grad_norm_spikes"], last["skipped_steps"]) == (0.0, 0.0)
    recs, _ = drive(tmp_path / "b", outs, None, global_norm_spike_threshold=4.0)
    last = [r for r in recs if isinstance(r, records.StepRecord)][-1].metrics
    assert (last["grad_norm_spikes"], last["skipped_steps"]) == (2.0, 0.0)


def test_state_collector_means_micro_losses_and_keeps_steps_apart() -> None:
    states = mf.StateCollector()
    states.add(3, "micro_local_lm_loss", np.float32(1.0))
    states.add(3, "micro_local_lm_loss", np.float32(3.0))
    states.add(3, "local_norm/fc.weight", np.array(0.5, dtype=np.float32))
    states.add(4, "max_attention_logit/l0", {"head_0": 2.0, "head_1": 4.0})
    states.add(2, "device_local_norm", np.array([7.0], dtype=np.float32))
    states.add(2, "note", "text is skipped")
    assert states.pop_before(3) == {2: {"device_local_norm": 7.0}}
    assert states.pop(3) == {"local_lm_loss": 2.0, "local_norm/fc.weight": 0.5}
    assert states.pop(4) == {
        "max_attention_logit/l0/head_0": 2.0,
        "max_attention_logit/l0/head_1": 4.0,
    }
    assert not states and states.pop(5) == {}


def test_last_pipeline_stage_alone_reports_the_loss(tmp_path: Path) -> None:
    ms.set_auto_parallel_context(pipeline_stages=2)
    try:
        on_last = [
            mf._on_last_stage(Monitor(run="p", rank=rank, world_size=4, log_dir=str(tmp_path)))
            for rank in range(4)
        ]
    finally:
        ms.set_auto_parallel_context(pipeline_stages=1)
    assert on_last == [False, False, True, True]


@pytest.mark.parametrize("threshold", [0, -1.0, "10", True])
def test_bad_threshold_is_named(threshold: Any) -> None:
    with pytest.raises(ValueError, match="global_norm_spike_threshold"):
        mf.RankwatchMonitor(global_norm_spike_threshold=threshold)


def test_registration_without_mindformers_says_why(caplog: pytest.LogCaptureFixture) -> None:
    try:
        import mindformers  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("MindFormers is importable here: the e2e test checks the registration")
    with caplog.at_level(logging.WARNING, logger="rankwatch.agent.mindformers"):
        assert mf.register() is False
    assert mf.REGISTERED is False
    message = caplog.records[-1].getMessage()
    assert (
        "MindFormers is not importable" in message and "callbacks=[RankwatchMonitor()]" in message
    )


def test_example_adds_the_entry_once() -> None:
    path = Path(__file__).parents[2] / "examples" / "mindformers_rankwatch.py"
    spec = importlib.util.spec_from_file_location("mindformers_rankwatch", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.RankwatchMonitor is mf.RankwatchMonitor  # what auto_register looks up
    added = example.with_rankwatch([{"type": "MFLossMonitor"}])
    assert added == [{"type": "MFLossMonitor"}, {"type": "RankwatchMonitor"}]
    assert example.with_rankwatch(added) == added
    assert example.with_rankwatch(None) == [{"type": "RankwatchMonitor"}]
