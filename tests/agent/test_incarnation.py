"""An agent's incarnation: kept with its JSONL file, new without it, honoured by resends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent.fallback import last_position, read_records
from rankwatch.agent.monitor import Monitor
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import MAX_INC, DecodeError, StepRecord


def lines(mon: Monitor) -> list[dict[str, Any]]:
    return [json.loads(line) for line in mon.jsonl_path.read_text().splitlines()]


def test_a_restart_with_its_jsonl_keeps_the_incarnation_and_the_seqs(tmp_path: Path) -> None:
    first = Monitor(run="r", rank=0, world_size=1, log_dir=tmp_path)
    first.log(1, loss=1.0)
    first.close()
    again = Monitor(run="r", rank=0, world_size=1, log_dir=tmp_path)
    again.log(2, loss=0.5)
    again.close()
    assert 1 <= first.incarnation < MAX_INC and again.incarnation == first.incarnation
    written = lines(again)
    assert {line["inc"] for line in written} == {first.incarnation}  # every line stands alone
    assert [line["seq"] for line in written] == list(range(1, len(written) + 1))


def test_a_restart_without_its_jsonl_is_a_new_incarnation(tmp_path: Path) -> None:
    made = [Monitor(run="r", rank=0, world_size=1, log_dir=tmp_path / d) for d in "AB"]
    for mon in made:
        mon.log(1, loss=1.0)
        mon.event("note", text="hello")
        mon.close()
    assert made[0].incarnation != made[1].incarnation
    for mon in made:  # steps, events and heartbeats: decoded with the process's own inc
        recs = list(read_records(mon.jsonl_path))
        assert {r.inc for r in recs} == {mon.incarnation} and recs[0].seq == 1


def test_a_file_of_an_agent_without_incarnations_is_continued_as_incarnation_0(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r" / "rank0.jsonl"
    path.parent.mkdir()
    old = StepRecord("r", 0, 7, 1.0, 1, "h", 1, 7, None, {"loss": 1.0})
    path.write_text(records.to_json_line(old))
    assert '"inc"' not in path.read_text() and last_position(path) == (7, 0)
    mon = Monitor(run="r", rank=0, world_size=1, log_dir=tmp_path)
    mon.log(8, loss=0.5)
    mon.close()
    assert mon.incarnation == 0
    assert all("inc" not in line for line in lines(mon))
    assert [r.seq for r in read_records(path)][:2] == [7, 8]


def test_read_records_of_one_incarnation(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    recs = [
        StepRecord("r", 0, s, 1.0, 1, "h", 1, s, None, {}, inc) for inc in (5, 9) for s in (1, 2)
    ]
    path.write_text("".join(map(records.to_json_line, recs)))
    assert [(r.inc, r.seq) for r in read_records(path, 2, inc=9)] == [(9, 2)]
    assert len(list(read_records(path))) == 4  # an import takes them all


@pytest.mark.parametrize("inc", [-1, 2**63, True, 1.5, "7"])
def test_a_bad_incarnation_is_refused_naming_the_field(inc: Any) -> None:
    raw = records.to_wire(StepRecord("r", 0, 1, 1.0, 1, "h", 1, 1, None, {"loss": 1.0}))
    raw["inc"] = inc
    with pytest.raises(DecodeError, match="'inc'"):
        records.decode_record(raw)
    with pytest.raises(DecodeError, match="'inc'"):
        records.decode_frame(records.encode_frame([raw]))


def test_resends_answer_only_requests_for_this_incarnation(router: Any, make_monitor: Any) -> None:
    mon = make_monitor(addr=router.addr)
    for step in range(1, 6):
        mon.log(step, loss=float(step))
    router.wait_for(lambda recs: sum(type(r) is StepRecord for r in recs) == 5)
    peer = next(iter(router.peers))
    sent = len(router.received)
    router.send(peer, {"v": 1, "resend_from": 1, "inc": mon.incarnation + 1})  # not ours
    router.send(peer, {"v": 1, "resend_from": 3, "inc": mon.incarnation})

    def resent(recs: list[records.Record]) -> list[records.Record]:
        return [r for r in recs[sent:] if type(r) is not records.Heartbeat]

    router.wait_for(lambda recs: len(resent(recs)) >= 4)
    router.poll(0.3)  # a resend from seq 1 would have come first, with the start event
    assert [r.seq for r in resent(router.received)] == [3, 4, 5, 6]
    assert {r.inc for r in router.received} == {mon.incarnation}
