"""What the PyTorch framework adapters (``lightning``, ``hf``) share; imports no framework.

``MonitorSpec`` makes the adapter's Monitor once the framework knows the rank. Its run name is
rank 0's, handed to the others through the framework's own broadcast when it has one: under
Lightning's own launcher rank 0 is the parent of the other ranks, so the launcher-derived name
(see ``identity``) differs between them, and only an agreed name keeps them in one run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import identity
from .monitor import Monitor

log = logging.getLogger("rankwatch.agent")

RESERVED_NAMES = ("step", "epoch")  # Monitor.log's own arguments


@dataclass
class MonitorSpec:
    """Arguments for the Monitor an adapter creates (None: from the environment)."""

    run: str | None = None
    rank: int | None = None
    world_size: int | None = None
    addr: str | None = None
    log_dir: str | os.PathLike[str] | None = None
    batch_size: float | None = None

    def given(self) -> bool:
        return any(v is not None for v in (self.run, self.rank, self.world_size, self.addr))

    def open(
        self,
        rank: int | None,
        world_size: int | None,
        broadcast: Callable[[str], str] | None = None,
    ) -> Monitor:
        """A Monitor for ``rank`` of ``world_size`` (explicit arguments of the spec win); with
        ``broadcast`` (every rank calls it, rank 0's value comes back) the run is rank 0's."""
        rank = self.rank if self.rank is not None else rank
        world_size = self.world_size if self.world_size is not None else world_size
        run = self.run
        if run is None and not os.environ.get("RANKWATCH_RUN", "").strip():
            run = identity.resolve(None, rank, world_size, self.addr, self.log_dir).run
            if broadcast is not None:
                run = broadcast(run)
        return Monitor(
            run=run,
            rank=rank,
            world_size=world_size,
            addr=self.addr,
            log_dir=self.log_dir,
            batch_size=self.batch_size,
        )


def batch_len(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor-like leaf, or None."""
    for _ in range(8):  # nested containers, bounded
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
            batch = batch[0] if len(batch) else None
        else:
            break
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        try:
            return int(shape[0])
        except (TypeError, ValueError):
            return None
    return None


def plain_metrics(values: Mapping[str, Any], taken: Sequence[str] = ()) -> dict[str, Any]:
    """``values`` whose names are usable metric names and not in ``taken`` (the adapter's own
    values win) or reserved."""
    return {
        k: v
        for k, v in values.items()
        if isinstance(k, str) and k and k not in taken and k not in RESERVED_NAMES
    }


class WarnOnce:
    """Log each warning key once: an adapter's hook runs every step."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._seen: set[str] = set()

    def __call__(self, key: str, message: str, *args: Any, exc_info: bool = False) -> None:
        if key not in self._seen:
            self._seen.add(key)
            log.warning(self.prefix + message, *args, exc_info=exc_info)
