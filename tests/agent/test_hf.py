"""The Hugging Face Trainer adapter in one real process: watch()'s arguments, log_interval,
the warning when the callback is added without watch(). The per-rank values across two real
ranks are tests/e2e/test_hf.py's."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rankwatch.agent.hf import RankwatchCallback, watch  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.hf,
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        logits = self.linear(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def trainer(tmp_path: Path, steps: int, **kwargs: Any) -> Trainer:
    data = [{"x": torch.randn(3), "labels": torch.tensor(i % 2)} for i in range(2 * steps)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=2,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    return Trainer(model=Tiny(), args=args, train_dataset=data, **kwargs)


def steps_in(path: Path) -> list[records.StepRecord]:
    recs = [records.from_json_line(line) for line in path.read_text().splitlines()]
    return [r for r in recs if isinstance(r, records.StepRecord)]


def test_watch_records_every_log_interval_steps(tmp_path: Path) -> None:
    t = trainer(tmp_path, 4)
    callback = watch(t, run="hf-one", log_dir=str(tmp_path), log_interval=2)
    with pytest.raises(ValueError, match="watched already"):
        watch(t)
    t.train()
    assert callback.monitor is None  # closed at the end: it made the Monitor
    logged = steps_in(tmp_path / "hf-one" / "rank0.jsonl")
    assert [r.step for r in logged] == [2, 4]
    history = {h["step"]: h for h in t.state.log_history if "loss" in h}
    for r in logged:  # one process: its own loss is the Trainer's
        assert r.metrics["loss"] == pytest.approx(history[r.step]["loss"], rel=1e-6)
        assert r.metrics["lr"] == pytest.approx(history[r.step]["learning_rate"])
        assert r.metrics["grad_norm"] == pytest.approx(history[r.step]["grad_norm"], rel=1e-6)


def test_callback_alone_warns_and_records_no_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = RankwatchCallback(run="hf-alone", log_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, "rankwatch.agent"):
        trainer(tmp_path, 2, callbacks=[callback]).train()
    assert "without watch(trainer)" in caplog.text
    logged = steps_in(tmp_path / "hf-alone" / "rank0.jsonl")
    assert [r.step for r in logged] == [1, 2]
    assert all("lr" in r.metrics and "loss" not in r.metrics for r in logged)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log_interval"):
        RankwatchCallback(log_interval=0)
    mon = Monitor(run="given", log_dir=str(tmp_path))
    with mon, pytest.raises(ValueError, match="either a Monitor"):
        RankwatchCallback(mon, run="other")
    with pytest.raises(ValueError, match="either a callback"):
        watch(object(), RankwatchCallback(), log_interval=2)
