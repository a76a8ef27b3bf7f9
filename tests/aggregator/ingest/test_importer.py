"""Importing agent JSONL and legacy per-rank logs into a real store."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rankwatch.agent.wire.records import EventRecord, Heartbeat, Record, StepRecord, to_json_line
from rankwatch.aggregator.ingest.importer import (
    BadLine,
    StoreSink,
    import_into_store,
    import_paths,
    iter_file,
)
from rankwatch.aggregator.store.db import Store, StoreError


class ListSink:
    """A sink that accepts everything (the pure contract: add(records) -> accepted count)."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, records: list[Record]) -> int:
        self.records.extend(records)
        return len(records)


def agent_file(path: Path, ranks: int = 2, steps: int = 30) -> list[Record]:
    records: list[Record] = []
    for rank in range(ranks):
        seq = 1
        records.append(EventRecord("job", rank, seq, 1.0, ranks, "n", 9, "start", None, {}))
        for st in range(steps):
            seq += 1
            loss = math.nan if (rank, st) == (1, 7) else 1.0 / (st + 1) + rank
            records.append(
                StepRecord("job", rank, seq, 2.0 + st, ranks, "n", 9, st, 0, {"loss": loss})
            )
        seq += 1
        records.append(Heartbeat("job", rank, seq, 99.0, steps - 1, 5.0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(to_json_line(r) for r in records))
    return records


def legacy_dir(root: Path) -> Path:
    root.mkdir()
    for rank in range(2):
        lines = [
            {"step": 1, "epoch": 0, "loss": 2.0 + rank, "lr": 0.01, "timestamp": 1.7e9,
             "rank": rank},
            {"step": 2, "epoch": 0, "loss": {"ce": 1.0, "aux": 0.5}, "lr": 0.01,
             "timestamp": 1.7e9 + 1, "rank": rank},
            {"step": 3, "epoch": 1, "loss": {"total": 9.0, "ce": 1.0}, "lr": 0.005,
             "timestamp": "2024-01-02T03:04:05+00:00", "grad_norm": 3.5, "tag": "x"},
        ]  # fmt: skip
        text = "".join(json.dumps(line) + "\n" for line in lines)
        text += "NaN garbage\n\n" if rank == 0 else ""
        text += json.dumps({"step": 4, "loss": float("nan"), "rank": rank}) + "\n"  # NaN token
        text += json.dumps({"event": "train_end", "step": -1, "rank": rank}) + "\n"
        (root / f"resnet_rank{rank}.jsonl").write_text(text)
    return root


def test_agent_jsonl_round_trips(tmp_path: Path) -> None:
    written = agent_file(tmp_path / "logs" / "job" / "rank0.jsonl")
    sink = ListSink()
    (summary,) = import_paths([tmp_path / "logs"], sink)
    assert (summary.format, summary.read, summary.accepted, summary.bad) == ("agent", 64, 64, 0)
    assert [to_json_line(r) for r in sink.records] == [to_json_line(r) for r in written]


def test_bad_lines_are_counted_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    good = StepRecord("job", 0, 1, 1.0, 1, "h", 1, 0, None, {"loss": 1.0})
    path.write_bytes(
        to_json_line(good).encode()
        + b"{not json\n"
        + b"[1, 2]\n"
        + b'{"v": 99, "kind": "step"}\n'
        + b'{"v": 1, "kind": "step", "run": "job"}\n'
        + b"\xff\xfe\n"
        + b"\n"
        + to_json_line(good).replace('"seq": 1', '"seq": 2').encode()
    )
    items = list(iter_file(path))
    bad = [i for i in items if isinstance(i, BadLine)]
    assert [b.line for b in bad] == [2, 3, 4, 5, 6]
    assert "not a JSON line" in bad[0].reason
    assert "newer than" in bad[2].reason
    assert "'rank' is missing" in bad[3].reason
    assert "UTF-8" in bad[4].reason
    (summary,) = import_paths([path], ListSink())
    assert (summary.read, summary.bad, len(summary.bad_lines)) == (2, 5, 5)
    assert str(summary.bad_lines[0]).startswith(f"{path}:2: ")


def test_legacy_per_rank_logs(tmp_path: Path) -> None:
    root = legacy_dir(tmp_path / "legacy")
    sink = ListSink()
    summaries = import_paths([root], sink)
    assert [(s.format, s.read, s.bad) for s in summaries] == [("legacy", 5, 1), ("legacy", 5, 0)]
    assert summaries[0].bad_lines[0].line == 4
    steps = [r for r in sink.records if isinstance(r, StepRecord)]
    r0 = [r for r in steps if r.rank == 0]
    assert {r.run for r in sink.records} == {"resnet"}
    assert [r.seq for r in r0] == [1, 2, 3, 6]  # line numbers
    assert r0[0].metrics == {"loss": 2.0, "lr": 0.01} and r0[0].world_size == 2
    assert r0[1].metrics == {"loss": 1.5, "loss/ce": 1.0, "loss/aux": 0.5, "lr": 0.01}
    assert r0[2].metrics == {"loss": 9.0, "loss/ce": 1.0, "lr": 0.005, "grad_norm": 3.5}
    assert r0[2].time == 1704164645.0 and r0[2].epoch == 1
    assert math.isnan(r0[3].metrics["loss"])
    ends = [r for r in sink.records if isinstance(r, EventRecord)]
    assert [(e.rank, e.event, e.step, e.info["legacy_event"]) for e in ends] == [
        (0, "end", None, "train_end"),
        (1, "end", None, "train_end"),
    ]


def test_import_into_store_twice_dedupes_and_builds_the_band(tmp_path: Path) -> None:
    legacy = legacy_dir(tmp_path / "legacy")
    agent_file(tmp_path / "logs" / "job" / "rank0.jsonl")
    data = tmp_path / "data"
    seen: list[tuple[int, int]] = []
    first = import_into_store(
        [legacy, tmp_path / "logs"], data, progress=lambda d, t: seen.append((d, t))
    )
    assert sum(s.accepted for s in first) == 10 + 64 and sum(s.duplicates for s in first) == 0
    assert seen[-1][0] == seen[-1][1] > 0
    again = import_into_store([legacy, tmp_path / "logs"], data)
    assert sum(s.accepted for s in again) == 0 and sum(s.duplicates for s in again) == 74
    with Store(data) as store:
        assert {r["run"]: r["records"] for r in store.runs()} == {"resnet": 10, "job": 64}
        assert store.metrics("resnet") == ["grad_norm", "loss", "loss/aux", "loss/ce", "lr"]
        band = store.band("resnet", "loss")
        assert band["step"] == [1, 2, 3, 4]
        assert band["median"][:3] == [2.5, 1.5, 9.0]
        assert math.isnan(band["median"][3])  # no finite value at step 4
        series = store.series("job", "loss")
        assert math.isnan(series[1]["value"][7])
        np.testing.assert_allclose(store.band("job", "loss")["median"][:3], [1.5, 1.0, 5 / 6])


def test_store_sink_dedupes_against_seen_seqs(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        store.append(
            [StepRecord("r", 0, q, 1.0, 1, "h", 1, q, None, {"x": 1.0}) for q in (1, 2, 5)]
        )
        store.flush()
        sink = StoreSink(store)
        batch = [StepRecord("r", 0, q, 1.0, 1, "h", 1, q, None, {"x": 1.0}) for q in range(1, 8)]
        assert sink.add(batch) == 4  # 3, 4, 6, 7
        assert sink.add(batch) == 0
        store.flush()
        assert store.seen_seqs() == [("r", 0, 0, 1, 7)]


def test_missing_path_is_an_error_and_a_bare_legacy_file_imports(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        import_paths([tmp_path / "nope.jsonl"], ListSink())
    path = tmp_path / "legacy_rank0.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n')
    assert import_into_store([path], tmp_path / "data")[0].accepted == 1


class DictSink:
    """Like Aggregator.add: returns accepted and duplicate counts."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int, int]] = set()

    def add(self, records: list[Record]) -> dict[str, int]:
        fresh = {(r.run, r.rank, r.seq) for r in records} - self.seen
        self.seen |= fresh
        return {"accepted": len(fresh), "duplicates": len(records) - len(fresh)}


def test_aggregator_style_sink_and_stderr_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent_file(tmp_path / "a" / "rank0.jsonl")
    sink = DictSink()
    first = import_paths([tmp_path / "a"], sink, progress=True)
    second = import_paths([tmp_path / "a"], sink)
    assert (first[0].accepted, first[0].duplicates) == (64, 0)
    assert (second[0].accepted, second[0].duplicates) == (0, 64)
    err = capsys.readouterr().err
    assert err.startswith("\rimporting: ") and err.endswith("(100%)\n")


def test_import_into_a_store_in_use_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Store(data).close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, duckdb; c = duckdb.connect(sys.argv[1]); print('ok', flush=True); "
         "sys.stdin.read()", str(data / "store.duckdb")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        path = tmp_path / "m_rank0.jsonl"
        path.write_text('{"step": 1, "loss": 1.0}\n')
        with pytest.raises(StoreError, match="import through it with --url"):
            import_into_store([path], data)
    finally:
        holder.communicate("")


HUGE = "1" + "0" * 400  # a JSON integer no float can hold


def test_an_integer_too_large_for_a_float_is_one_bad_line_and_the_rest_import(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rank0.jsonl"
    good = agent_file(path, ranks=1, steps=3)
    lines = path.read_text().splitlines()
    huge_metric = lines[1].replace('"loss":', f'"loss":{HUGE},"x":', 1)
    huge_time = json.loads(lines[1])
    huge_time["seq"] = 99
    text = json.dumps(huge_time).replace(f'"time": {huge_time["time"]!r}', f'"time": {HUGE}')
    assert HUGE in huge_metric and HUGE in text
    path.write_text("\n".join([*lines, huge_metric, text]) + "\n")
    sink = ListSink()
    summary = import_paths([path], sink)[0]
    assert sink.records == good and summary.bad == 2
    assert all("too large for a float" in b.reason for b in summary.bad_lines)
    legacy = tmp_path / "legacy_rank0.jsonl"
    legacy.write_text(f'{{"step": 1, "loss": 1.0}}\n{{"step": 2, "loss": {HUGE}}}\n'
                      f'{{"step": 3, "loss": 1.0, "lr": {HUGE}}}\n')  # fmt: skip
    sink = ListSink()
    summary = import_paths([legacy], sink)[0]
    assert [r.step for r in sink.records] == [1] and summary.bad == 2  # type: ignore[union-attr]
