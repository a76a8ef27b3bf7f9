"""The MindSpore callback's side of commands (``commands.py``): checkpoints in MindSpore's own
format and the stop at the agreed step.

Imported by ``mindspore.py`` only (it imports MindSpore). ``TrainMonitor(accept=...)`` registers
a ``CheckpointSaver`` as the Monitor's checkpoint handler and asks ``should_stop`` at each step
end; a stop calls ``run_context.request_stop()``, so ``model.train`` returns after that step
on every rank alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mindspore as ms

log = logging.getLogger(__name__)

# A checkpoint callable the user passes: (step, cb_params) -> where it saved (or None).
SaveFn = Callable[[int, Any], Any]


class CheckpointSaver:
    """Saves ``cb_params.train_network`` with ``mindspore.save_checkpoint`` (the format
    ``ModelCheckpoint`` writes and ``load_checkpoint`` reads) as
    ``<directory>/rank<k>-step<s>.ckpt``, or calls the user's ``save(step, cb_params)``."""

    def __init__(self, directory: Path, rank: int, save: SaveFn | None = None) -> None:
        self.directory = directory
        self.rank = rank
        self.save = save
        self.cb_params: Any = None  # the callback's, set at each step end
        self.monitor: Any = None  # the Monitor it is registered with

    def __call__(self, step: int) -> str:
        if self.cb_params is None:
            raise RuntimeError("no training step has ended yet: nothing to save")
        if self.save is not None:
            where = self.save(step, self.cb_params)
            return "" if where is None else str(where)
        network = self.cb_params.get("train_network") or self.cb_params.get("network")
        if network is None:
            raise RuntimeError("the callback parameters hold no network to save")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"rank{self.rank}-step{step}.ckpt"
        ms.save_checkpoint(network, str(path))
        log.warning("rankwatch: checkpoint of step %d saved to %s", step, path)
        return str(path)


def checkpoint_dir(jsonl: Path, given: str | Path | None) -> Path:
    """``given``, or ``checkpoints/`` beside the rank's JSONL (the run's log directory)."""
    return Path(given).expanduser() if given is not None else jsonl.parent / "checkpoints"
