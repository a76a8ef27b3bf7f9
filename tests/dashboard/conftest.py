"""Shared fixtures for the dashboard tests: a real Aggregator over a real store in tmp_path."""

from __future__ import annotations

import csv
import math
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Starlette >= 1.x warns at import time when its TestClient runs on httpx rather than httpx2;
# pytest turns warnings into errors, so take the import here once, with that one warning off.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2` instead")
    import starlette.testclient  # noqa: F401

from rankwatch.agent.wire.records import EventRecord, StepRecord

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHIFTED = FIXTURES / "msrun4_rank2_labels_shifted_from_step20.csv"
STEP_S = 0.01  # wall-clock seconds between synthetic steps
# TestClient's own default host ("testserver") is a name the app does not answer to
BASE_URL = "http://localhost"


class Records:
    """Builds wire records with per-rank sequence numbers, as agents would."""

    def __init__(self) -> None:
        self.seq: dict[tuple[str, int], int] = {}
        # Recent, like live traffic: the aggregator keeps old imported history out of the
        # live state (health, divergence, alerts), and these records stand for a live run.
        self.t0 = time.time() - 60.0

    def _next(self, run: str, rank: int) -> int:
        self.seq[(run, rank)] = self.seq.get((run, rank), 0) + 1
        return self.seq[(run, rank)]

    def step(
        self,
        run: str,
        rank: int,
        step: int,
        world_size: int,
        t: float | None = None,
        **metrics: float,
    ) -> StepRecord:
        return StepRecord(
            run=run,
            rank=rank,
            seq=self._next(run, rank),
            time=self.t0 + step * STEP_S if t is None else t,
            world_size=world_size,
            host=f"node{rank // 8}",
            pid=1000 + rank,
            step=step,
            epoch=None,
            metrics=metrics,
        )

    def event(
        self, run: str, rank: int, kind: str, step: int | None, world_size: int, **info: Any
    ) -> EventRecord:
        return EventRecord(
            run=run,
            rank=rank,
            seq=self._next(run, rank),
            time=self.t0 + (step or 0) * STEP_S,
            world_size=world_size,
            host=f"node{rank // 8}",
            pid=1000 + rank,
            event=kind,
            step=step,
            info=info,
        )


def fixture_rows(path: Path = SHIFTED) -> list[tuple[int, int, float]]:
    with path.open() as f:
        return [(int(r["step"]), int(r["rank"]), float(r["loss"])) for r in csv.DictReader(f)]


@pytest.fixture
def recs() -> Records:
    return Records()


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[Any]:
    from rankwatch.aggregator.service import Aggregator, ServeConfig

    config = ServeConfig(
        data_dir=tmp_path / "data",
        ingest_host="127.0.0.1",
        ingest_port=0,
        console_alerts=False,
        resend_gaps=False,
    )
    agg = Aggregator(config)
    yield agg
    agg.stop()


def settle(agg: Any) -> None:
    """What the service threads do every tick: publish, alert, write the store."""
    agg.tick()
    assert agg.flush_store()


def feed_shifted_run(agg: Any, recs: Records, run: str = "msrun4") -> None:
    """The real 4-rank msrun trace where rank 2's labels go bad from step 20."""
    batch = [recs.event(run, rank, "start", None, 4) for rank in range(4)]
    for step, rank, loss in fixture_rows():
        batch.append(recs.step(run, rank, step, 4, loss=loss, lr=0.01))
    agg.add(batch)
    settle(agg)


def finite_or_str(values: list[Any]) -> list[float]:
    return [
        v if isinstance(v, (int, float)) else {"NaN": math.nan}.get(v, math.inf) for v in values
    ]
