"""Stored runs in the snapshot: a real Aggregator over a real store in tmp_path, reopened as a
restarted `serve` would, and the `rankwatch status` text a person reads."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from rankwatch.agent.wire.records import EventRecord, Record, StepRecord
from rankwatch.aggregator.alerts.console import render_status
from rankwatch.aggregator.ingest.importer import import_into_store
from rankwatch.aggregator.service import Aggregator, ServeConfig

DAY_S = 86_400.0


def config(data: Path) -> ServeConfig:
    return ServeConfig(data_dir=data, ingest_host="127.0.0.1", ingest_port=0, console_alerts=False)


def step(run: str, rank: int, seq: int, t: float) -> StepRecord:
    return StepRecord(
        run=run, rank=rank, seq=seq, time=t, world_size=2, host=f"node{rank}", pid=10 + rank,
        step=seq, epoch=0, metrics={"loss": 1.0 / seq},
    )  # fmt: skip


def event(run: str, rank: int, seq: int, t: float, kind: str) -> EventRecord:
    return EventRecord(
        run=run, rank=rank, seq=seq, time=t, world_size=2, host=f"node{rank}", pid=10 + rank,
        event=kind, step=seq - 1, info={},
    )  # fmt: skip


def history(run: str, t0: float, ends: tuple[str | None, str | None]) -> list[Record]:
    out: list[Record] = []
    for rank, end in enumerate(ends):
        out += [step(run, rank, s, t0 + s) for s in range(1, 11)]
        if end is not None:
            out.append(event(run, rank, 11, t0 + 11, end))
    return out


def stored_then_reopened(data: Path, records: list[Record]) -> Aggregator:
    """The records go through a first aggregator into the store; a second one opens it, as a
    restarted `rankwatch serve` does: it has no live state of any of them."""
    first = Aggregator(config(data))
    first.add(records)
    assert first.flush_store()
    first.store.close()
    return Aggregator(config(data))


def test_a_restarted_aggregator_lists_every_stored_run_with_its_final_state(
    tmp_path: Path,
) -> None:
    t0 = time.time() - DAY_S
    agg = stored_then_reopened(
        tmp_path / "data",
        history("done", t0, ("end", "end"))
        + history("broke", t0 + 100, ("end", "crash"))
        + history("cut", t0 + 200, (None, "end")),
    )
    try:
        assert agg.snapshot()["runs"] == []  # nothing live: what status printed before
        snap = agg.snapshot(history=True)
        runs = {r["run"]: r for r in snap["runs"]}
        assert [r["run"] for r in snap["runs"]] == ["cut", "broke", "done"]  # newest first
        assert {n: r["state"] for n, r in runs.items()} == {
            "done": "finished", "broke": "crashed", "cut": "ended",
        }  # fmt: skip
        assert [r["state"] for r in runs["broke"]["ranks"]] == ["finished", "crashed"]
        assert [r["state"] for r in runs["cut"]["ranks"]] == ["unknown", "finished"]
        # the training's clock, not when the records reached the store
        assert runs["done"]["last_time"] == runs["done"]["record_time"] == t0 + 11
        assert all(r["history"] for r in snap["runs"])
        text = render_status(snap, now=t0 + DAY_S)
        head = "run done  [finished, stored]  world size 2  last step 10  last record 24.0h ago"
        assert head in text
        assert "run broke  [crashed, stored]" in text and "rank 1: crashed at step 10" in text
        assert "run cut  [ended, stored]" in text
        assert "1 of 2 ranks sent no end or crash event: finished, killed or cut off" in text
        assert "no runs yet" not in text
        # cheap form: counts and metric names, no rank entries
        light = {r["run"]: r for r in agg.snapshot(history=True, ranks=False)["runs"]}
        assert light["done"]["ranks_seen"] == 2 and light["done"]["metrics"] == ["loss"]
        assert "ranks" not in light["done"]
        only = agg.snapshot(history=True, run="broke")["runs"]
        assert [r["run"] for r in only] == ["broke"]
    finally:
        agg.store.close()


def test_live_and_stored_runs_together_newest_first_with_the_records_time(
    tmp_path: Path,
) -> None:
    t0 = time.time() - DAY_S
    agg = stored_then_reopened(tmp_path / "data", history("old", t0, ("end", "end")))
    try:
        # a recent import (a backfill) goes live; its records say they were written 5 min ago
        written = time.time() - 300
        agg.add(history("backfill", written, (None, None)))
        assert agg.flush_store()
        snap = agg.snapshot(history=True)
        assert [r["run"] for r in snap["runs"]] == ["backfill", "old"]
        live = snap["runs"][0]
        assert "history" not in live and live["state"] != "ended"
        assert live["record_time"] == written + 10
        text = render_status(snap)
        assert "run backfill  [" in text and "last record 5m ago" in text
    finally:
        agg.store.close()


def test_legacy_train_end_imports_as_finished(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    t0 = time.time() - 2 * DAY_S
    for rank in range(2):
        lines = [
            f'{{"step": {s}, "epoch": 0, "loss": {1.0 / s}, "timestamp": {t0 + s}}}'
            for s in range(1, 6)
        ]
        if rank == 0:
            lines.append('{"event": "train_end", "step": -1}')
        (logs / f"gpt_rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    data = tmp_path / "data"
    import_into_store([logs], data)
    agg = Aggregator(config(data))
    try:
        (run,) = agg.snapshot(history=True)["runs"]
        assert run["run"] == "gpt" and run["state"] == "ended"
        assert [r["state"] for r in run["ranks"]] == ["finished", "unknown"]
        assert run["record_time"] == t0 + 5
    finally:
        agg.store.close()


def test_a_big_stored_run_lists_its_unfinished_ranks_first_and_counts_them_all(
    tmp_path: Path,
) -> None:
    t0 = time.time() - DAY_S
    records: list[Record] = []
    for rank in range(100):
        records += [dataclasses.replace(step("big", rank, s, t0 + s), world_size=100)
                    for s in range(1, 4)]  # fmt: skip
        if rank < 80:
            records.append(
                dataclasses.replace(event("big", rank, 4, t0 + 4, "end"), world_size=100)
            )
    agg = stored_then_reopened(tmp_path / "data", records)
    try:
        (every,) = agg.snapshot(history=True)["runs"]
        assert every["rank_states"] == {"finished": 80, "unknown": 20}
        assert [r["rank"] for r in every["ranks"]] == list(range(80, 100))  # at most 64
        assert every["ranks_seen"] == 100
        text = render_status({"runs": [every]}, now=t0 + DAY_S)
        assert "  ranks: 80 finished, 20 unknown" in text
        assert "  20 of 100 ranks sent no end or crash event" in text
        assert "  (80 more ranks not listed; --run big --all lists every rank)" in text
        (one,) = agg.snapshot(history=True, run="big")["runs"]
        assert len(one["ranks"]) == 100 and "ranks_seen" not in one
        folded = render_status({"runs": [one]}, now=t0 + DAY_S)
        assert "  (80 more ranks finished, not divergent, nothing missing" in folded
    finally:
        agg.store.close()
