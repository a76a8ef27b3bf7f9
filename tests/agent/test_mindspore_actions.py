"""TrainMonitor acting on commands in a real MindSpore training: a checkpoint in MindSpore's own
format at the agreed step, then ``request_stop`` there; a rank that did not opt in trains on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.mindspore
ms = pytest.importorskip("mindspore", reason="MindSpore is not installed")

from mindspore import nn  # noqa: E402
from mindspore.train import Model  # noqa: E402
from rankwatch.agent.mindspore import TrainMonitor  # noqa: E402
from rankwatch.agent.monitor import Monitor  # noqa: E402
from rankwatch.agent.wire import records  # noqa: E402
from rankwatch.agent.wire.commands import Command  # noqa: E402

from .test_mindspore import BATCHES, ScalarLoss, dataset, read, steps_of  # noqa: E402

STOP_AT = 2


def command(kind: str, ident: str) -> dict[str, Any]:
    return Command(ident, kind, "t", 0, STOP_AT, by="test").to_wire()


def acks(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in read(path):
        if isinstance(r, records.EventRecord) and r.event == "command":
            out.setdefault(str(r.info["id"]), []).append(str(r.info["state"]))
    return out


def test_checkpoint_then_stop_at_the_agreed_step(tmp_path: Path) -> None:
    assert BATCHES > STOP_AT + 1  # steps after it are left untrained
    mon = Monitor(run="t", log_dir=tmp_path, accept=("checkpoint", "stop"))
    net = ScalarLoss()
    train_net = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
    callback = TrainMonitor(mon, checkpoint_dir=str(tmp_path / "ck"))
    assert mon.commands is not None
    mon.commands.receive(command("checkpoint", "k1"), None)  # as the sender thread hands it
    mon.commands.receive(command("stop", "s1"), None)
    Model(train_net).train(1, dataset(), callbacks=[callback])
    mon.close()
    assert [s.step for s in steps_of(read(mon.jsonl_path))] == list(range(1, STOP_AT + 1))
    path = tmp_path / "ck" / f"rank0-step{STOP_AT}.ckpt"
    loaded = ms.load_checkpoint(str(path))
    for p in net.trainable_params():
        np.testing.assert_array_equal(loaded[p.name].asnumpy(), p.asnumpy())
    assert acks(mon.jsonl_path) == {"k1": ["received", "done"], "s1": ["received", "done"]}


def test_a_user_checkpoint_and_no_opt_in(tmp_path: Path) -> None:
    saved: list[int] = []
    mon = Monitor(run="t", log_dir=tmp_path, accept="checkpoint")
    net = ScalarLoss()
    train_net = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
    callback = TrainMonitor(mon, checkpoint=lambda step, cb: saved.append(step) or "mine")
    assert mon.commands is not None
    mon.commands.receive(command("checkpoint", "k1"), None)
    mon.commands.receive(command("stop", "s1"), None)  # not accepted: trains on
    Model(train_net).train(1, dataset(), callbacks=[callback])
    mon.close()
    assert len(steps_of(read(mon.jsonl_path))) == BATCHES and saved == [STOP_AT]
    assert acks(mon.jsonl_path) == {"k1": ["received", "done"], "s1": ["refused"]}
