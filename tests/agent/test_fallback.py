"""The JSONL writer on real files: append only, one write per record, failures counted."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from rankwatch.agent.fallback import JsonlWriter, jsonl_path, last_seq, read_records
from rankwatch.agent.wire.records import Heartbeat, StepRecord, to_json_line


def step(seq: int, value: float = 0.5) -> StepRecord:
    return StepRecord("r", 0, seq, 1.0, 1, "h", 1, seq, None, {"loss": value})


def beat(seq: int) -> Heartbeat:
    return Heartbeat("r", 0, seq, 1.0, 3, 5.0, 0)


def lines(*recs: StepRecord | Heartbeat) -> bytes:
    return "".join(to_json_line(r) for r in recs).encode()


@pytest.mark.parametrize(
    ("run", "rank", "tail"),
    [
        ("train-1", 0, "train-1/rank0.jsonl"),
        ("a/b", 3, "rank3.jsonl"),
    ],
)
def test_jsonl_path(run: str, rank: int, tail: str, tmp_path: Path) -> None:
    path = jsonl_path(tmp_path, run, rank)
    assert str(path).endswith(tail)
    assert path.parent.parent == tmp_path  # the run never escapes log_dir


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", 0),
        (lines(step(1), step(2), step(3)), 3),
        (lines(step(1), beat(5), step(4)), 5),  # heartbeats come from another thread
        (lines(step(1), step(2)) + b'{"v":1,"kind":"step","seq":9', 2),  # cut by kill -9
        (b"garbage\n" + lines(step(7)), 7),
        (b'{"seq": "x"}\n[1]\n', 0),
    ],
)
def test_last_seq(content: bytes, expected: int, tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(content)
    assert last_seq(path) == expected


def test_last_seq_of_missing_file(tmp_path: Path) -> None:
    assert last_seq(tmp_path / "nope.jsonl") == 0


def test_last_seq_reads_only_the_tail_of_a_big_file(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(lines(*(step(i) for i in range(1, 20_001))))
    assert path.stat().st_size > 1_000_000
    assert last_seq(path) == 20_000


def test_writer_appends_and_never_truncates(tmp_path: Path) -> None:
    path = tmp_path / "run" / "rank0.jsonl"
    first = JsonlWriter(path)
    assert first.start_seq == 0
    assert first.write(lines(step(1), step(2)))
    first.close()
    second = JsonlWriter(path)
    assert second.start_seq == 2
    assert second.write(lines(step(3)))
    second.close()
    assert [r.seq for r in read_records(path)] == [1, 2, 3]


def test_writer_starts_a_fresh_line_after_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(lines(step(1)) + b'{"v":1,"kind":"st')
    writer = JsonlWriter(path)
    writer.write(lines(step(2)))
    writer.close()
    text = path.read_text().splitlines()
    assert text[1] == '{"v":1,"kind":"st'
    assert [r.seq for r in read_records(path)] == [1, 2]


def test_each_write_is_visible_at_once(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    writer = JsonlWriter(path)
    for seq in range(1, 50):
        writer.write(lines(step(seq)))
        assert path.stat().st_size == len(lines(*(step(i) for i in range(1, seq + 1))))
    writer.close()


def test_full_disk_is_counted_and_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    path = tmp_path / "run" / "rank0.jsonl"
    path.parent.mkdir()
    path.symlink_to("/dev/full")  # every write fails with ENOSPC
    with caplog.at_level(logging.WARNING, "rankwatch.agent"):
        writer = JsonlWriter(path)
        results = [writer.write(lines(step(i))) for i in range(1, 6)]
    assert results == [False] * 5
    assert writer.errors == 5
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "No space left" in warnings[0].getMessage()
    writer.close()


def test_unopenable_file_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    writer = JsonlWriter(blocker / "run" / "rank0.jsonl")  # a file where a folder should be
    assert writer.closed
    assert writer.write(b"{}\n") is False
    assert writer.errors == 2  # the failed open and the failed write
    writer.close()


@pytest.mark.parametrize(("from_seq", "expected"), [(1, [1, 2, 3, 4]), (3, [3, 4]), (9, [])])
def test_read_records_from_seq(from_seq: int, expected: list[int], tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    content = lines(step(1), step(2)) + b"not json\n" + lines(beat(3), step(4))
    path.write_bytes(content + b'{"v":1,"kind":"step"')
    assert [r.seq for r in read_records(path, from_seq)] == expected


def test_read_records_of_missing_file(tmp_path: Path) -> None:
    assert list(read_records(tmp_path / "nope.jsonl")) == []


def test_nonfinite_values_survive(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    writer = JsonlWriter(path)
    writer.write(lines(step(1, float("nan")), step(2, float("inf")), step(3, -float("inf"))))
    writer.close()
    values = [r.metrics["loss"] for r in read_records(path)]  # type: ignore[union-attr]
    assert values[0] != values[0] and values[1:] == [float("inf"), -float("inf")]
