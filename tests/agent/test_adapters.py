"""What the framework adapters share (lr, batch size, the Monitor they make), and the Lightning
callback in one real process: accumulation, self.log values, the lr the step used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.adapter import MonitorSpec, batch_len, plain_metrics
from rankwatch.agent.wire import records

torch = pytest.importorskip("torch")

from rankwatch.agent.torch import optimizer_lr  # noqa: E402

pytestmark = pytest.mark.torch


def optimizer(*rates: float) -> Any:
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in rates]
    return torch.optim.SGD([{"params": [p], "lr": r} for p, r in zip(params, rates, strict=True)])


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([(0.1,)], {"lr": 0.1}),
        ([(0.1, 0.1)], {"lr": 0.1}),
        ([(0.1, 0.01)], {"lr": 0.1, "lr/0": 0.1, "lr/1": 0.01}),
        ([(0.1,), (0.2,)], {"lr": 0.1, "lr/0": 0.1, "lr/1": 0.2}),  # numbered across optimizers
        ([], {}),
    ],
)
def test_optimizer_lr(rates: list[tuple[float, ...]], expected: dict[str, float]) -> None:
    assert optimizer_lr([optimizer(*r) for r in rates]) == expected


def test_optimizer_lr_skips_what_is_no_rate() -> None:
    class Odd:
        def __init__(self) -> None:
            self.param_groups = [{"lr": "fast"}, {"no": 1}, {"lr": 0.5}]

    assert optimizer_lr([None, Odd()]) == {"lr": 0.5}


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        ((torch.zeros(4, 3), torch.zeros(4)), 4),
        ({"input_ids": torch.zeros(6, 16), "labels": torch.zeros(6, 16)}, 6),
        ([{"x": [torch.zeros(2, 1)]}], 2),
        (torch.zeros(()), None),
        ("text", None),
        ([], None),
        ({}, None),
    ],
)
def test_batch_len(batch: Any, expected: int | None) -> None:
    assert batch_len(batch) == expected


def test_plain_metrics_leaves_the_adapters_names_and_reserved_ones() -> None:
    values = {"loss": 1.0, "acc": 0.5, "step": 3, "epoch": 1, "": 2.0}
    assert plain_metrics(values, ("loss",)) == {"acc": 0.5}


def test_monitor_spec_takes_rank_0s_run(tmp_path: Path) -> None:
    calls: list[str] = []

    def broadcast(run: str) -> str:
        calls.append(run)
        return "rank0-run"

    spec = MonitorSpec(log_dir=str(tmp_path))
    with spec.open(1, 2, broadcast) as mon:
        assert (mon.run, mon.rank, mon.world_size) == ("rank0-run", 1, 2)
    assert len(calls) == 1 and calls[0] != "rank0-run"  # its own derived name went out
    with MonitorSpec(run="mine", rank=0, world_size=1, log_dir=str(tmp_path)).open(
        3, 4, broadcast
    ) as mon:  # explicit arguments win, and a given run is not broadcast
        assert (mon.run, mon.rank, mon.world_size) == ("mine", 0, 1)
    assert len(calls) == 1


# --- the Lightning callback in one process -----------------------------------------------


@pytest.mark.lightning
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_lightning_callback_records_each_step(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from rankwatch.agent.lightning import RankwatchCallback

    steps, accumulate = 3, 2
    batches = [
        (torch.randn(4, 3, generator=torch.Generator().manual_seed(i)), torch.tensor([0, 1, 0, 1]))
        for i in range(steps * accumulate)
    ]
    seen: list[float] = []

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(3, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            seen.append(float(loss))
            self.log("own", float(batch_idx), on_step=True)
            self.log("synced", loss, on_step=True, sync_dist=True)
            return loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(batches, batch_size=None)

    callback = RankwatchCallback(run="tiny", log_dir=str(tmp_path))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulate,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Tiny())
    assert callback.monitor is None  # closed at the end: it made the Monitor

    lines = (tmp_path / "tiny" / "rank0.jsonl").read_text().splitlines()
    recs = [records.from_json_line(line) for line in lines]
    steps_logged = [r for r in recs if isinstance(r, records.StepRecord)]
    assert [r.step for r in steps_logged] == [1, 2, 3]
    for i, r in enumerate(steps_logged):
        micro = seen[i * accumulate : (i + 1) * accumulate]
        assert r.metrics["loss"] == pytest.approx(sum(micro) / accumulate, rel=1e-6)
        assert r.metrics["lr"] == 1.0 * 0.5**i  # the rate the step used, not the next one's
        assert r.metrics["own"] == float((i + 1) * accumulate - 1)  # the step's last batch
        # In one process Lightning syncs nothing: a sync_dist=True value is this rank's own.
        assert r.metrics["synced"] == pytest.approx(micro[-1], rel=1e-6)
        assert "grad_norm_local" not in r.metrics  # no DDP in one process
    for r in steps_logged[1:]:  # samples of all the step's micro-batches per second
        assert r.metrics["throughput"] == pytest.approx(accumulate * 4 / r.metrics["step_time"])
    assert [r.event for r in recs if isinstance(r, records.EventRecord)] == ["start", "end"]


def test_try_local_grad_norm_hook(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch.distributed as dist
    from rankwatch.agent.torch import LocalGradNorm, try_local_grad_norm_hook
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    assert try_local_grad_norm_hook(torch.nn.Linear(2, 2), None) is None
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        fresh = DistributedDataParallel(torch.nn.Linear(2, 2))
        state = try_local_grad_norm_hook(fresh, None)
        assert isinstance(state, LocalGradNorm)
        fresh(torch.ones(1, 2)).sum().backward()
        assert state.value is not None and float(state.value) > 0

        hooked = DistributedDataParallel(torch.nn.Linear(2, 2))
        hooked.register_comm_hook(None, default_hooks.allreduce_hook)  # a framework's own
        assert try_local_grad_norm_hook(hooked, None) is None
        assert "has a comm hook already" in caplog.text
    finally:
        dist.destroy_process_group()
