"""Stored runs of many ranks, written through the real ``Store`` before ``rankwatch serve``
opens it, a few steps per rank: 100,000 ranks through the bulk path (no hosts: the node map
folds them in blocks), one culprit rank off the others with an incident naming it and two ranks
it reached, one crashed rank; and 2,048 ranks on 256 named nodes of 8. For the page's test at
that size and ``bench/page_100k.py``."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rankwatch.agent.wire.records import EventRecord, StepBlock
from rankwatch.aggregator.incidents.model import Evidence, Incident
from rankwatch.aggregator.store.db import Store

RANKS_PER_NODE = 8


@dataclass(frozen=True)
class BigRun:
    run: str
    world: int
    steps: int
    culprit: int
    affected: tuple[int, ...]
    crashed: int

    def host(self, rank: int) -> str:
        return host_of(rank)


def host_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE:05d}"


def fill(
    data_dir: Path, world: int = 100_000, steps: int = 3, hosts_world: int = 2048
) -> tuple[BigRun, BigRun]:
    """The 100,000-rank run and the run on named nodes, stored in ``data_dir``."""
    t0 = time.time() - 3600.0  # an hour ago: runs the store holds, with no live state
    big = _big(world, steps)
    rank = np.repeat(np.arange(world), steps)
    step = np.tile(np.arange(1, steps + 1), world)
    loss = (2.0 / step + 0.5) * (1 + 0.01 * np.sin(rank * 12.9898 + step * 78.233))
    loss[(rank == big.culprit) & (step > 1)] *= 2.5
    crash = EventRecord(big.run, big.crashed, steps + 1, t0 + steps, world, "", 1000, "crash",
                        steps, {"message": "RuntimeError: NCCL timeout"})  # fmt: skip
    named = BigRun("big-nodes", hosts_world, steps, hosts_world // 2 + 5, (), -1)
    with Store(data_dir) as store:
        store.append_steps(big.run, "loss", rank, step, loss, seq=step, time_s=t0 + step,
                           world_size=world)  # fmt: skip
        store.append([crash])
        store.append_incident(_incident(big, t0))
        store.append(_blocks(named, t0))
        store.flush()
    return big, named


def _big(world: int, steps: int) -> BigRun:
    culprit = world * 7 // 9 + 3  # mid-block, far from the first page in rank order
    return BigRun("big-100k", world, steps, culprit, (culprit - 1, culprit + 1), world // 23)


def _incident(big: BigRun, t0: float) -> dict[str, object]:
    evidence = Evidence(2, t0 + 2, big.culprit, "loss diverged (z=40.1)")
    incident = Incident(
        id=f"{big.run}#1", run=big.run, cause="divergence", culprits=(big.culprit,),
        affected=big.affected, terminated=(), timeline=(evidence,), opened=t0 + 2,
        updated=t0 + 3, resolved=None, state="firing",
        summary=f"rank {big.culprit} diverged on loss at step 2", basis="earliest step",
        step=2, evidence_count=1,
    )  # fmt: skip
    return {**incident.as_dict(), "hosts": {}}


def _blocks(named: BigRun, t0: float) -> list[StepBlock]:
    """Every rank of ``named`` as one block of its steps, on its node; one rank off."""
    seq = list(range(1, named.steps + 1))
    times = [t0 + s for s in seq]
    out = []
    for rank in range(named.world):
        off = 1.8 if rank == named.culprit else 1.0
        loss = [(2.0 / s + 0.5) * off * (1 + 0.01 * math.sin(rank * 1.7 + s)) for s in seq]
        out.append(StepBlock(named.run, rank, named.world, host_of(rank), 1000 + rank, seq,
                             times, seq, [None] * named.steps, {"loss": loss}))  # fmt: skip
    return out
