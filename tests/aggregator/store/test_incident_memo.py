"""A run's stored incidents are decoded once per flush that stores one of its judgements: the
memo alone, and through a real store on disk (reads after each flush, other runs' flushes,
callers that add keys to what they read)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from rankwatch.aggregator.actions.desk import annotate
from rankwatch.aggregator.store import incidents as stored_incidents
from rankwatch.aggregator.store.db import Store
from rankwatch.aggregator.store.incidents import Memo


def incident(run: str, n: int, updated: float, **extra: Any) -> dict[str, Any]:
    return {"id": f"{run}#{n}", "run": run, "cause": "nonfinite", "culprits": [2],
            "affected": list(range(3, 40)), "terminated": [], "opened": 1.0,
            "updated": updated, "resolved": None, "state": "firing", "summary": "s",
            "timeline": [{"rank": 2, "step": 20, "what": "loss non-finite"}], **extra}  # fmt: skip


class Fetches:
    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies
        self.calls = 0

    def __call__(self) -> list[dict[str, Any]]:
        self.calls += 1
        return [dict(b) for b in self.bodies]


def test_the_memo_fetches_once_until_its_run_is_stored_again() -> None:
    memo = Memo()
    fetch = Fetches([incident("a", 1, 1.0)])
    first = memo.read("a", fetch)
    assert memo.read("a", fetch) == first and fetch.calls == 1
    memo.stored(["b"])  # another run's judgement
    memo.read("a", fetch)
    assert fetch.calls == 1
    fetch.bodies = [incident("a", 1, 2.0)]
    memo.stored(["a"])
    assert memo.read("a", fetch)[0]["updated"] == 2.0 and fetch.calls == 2


def test_what_a_reader_adds_stays_out_of_the_next_read() -> None:
    memo = Memo()
    fetch = Fetches([incident("a", 1, 1.0)])
    got = memo.read("a", fetch)
    got[0]["timeline"] = []
    got.append({"id": "x"})
    annotate({got[0]["id"]: got[0]}, [{"incident": "a#1", "id": "c1", "kind": "stop"}])
    assert "actions" in got[0]
    again = memo.read("a", fetch)
    assert again == [incident("a", 1, 1.0)] and fetch.calls == 1


def test_a_flush_during_a_fetch_is_not_kept_stale() -> None:
    memo = Memo()
    fetching, go = threading.Event(), threading.Event()
    bodies = [incident("a", 1, 1.0)]

    def slow() -> list[dict[str, Any]]:
        old = [dict(b) for b in bodies]
        fetching.set()
        go.wait(5)
        return old

    reader = threading.Thread(target=memo.read, args=("a", slow))
    reader.start()
    assert fetching.wait(5)
    bodies[:] = [incident("a", 1, 2.0)]
    memo.stored(["a"])  # stored while the read was under way: its answer is one behind
    go.set()
    reader.join(5)
    fetch = Fetches(bodies)
    assert memo.read("a", fetch)[0]["updated"] == 2.0 and fetch.calls == 1


def test_a_store_decodes_a_runs_incidents_once_per_flush_that_stored_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []
    real = stored_incidents.read

    def counted(cur: Any, run: str) -> list[dict[str, Any]]:
        decoded.append(run)
        return real(cur, run)

    monkeypatch.setattr(stored_incidents, "read", counted)
    store = Store(tmp_path / "s.duckdb")
    try:
        store.append_incident(incident("a", 1, 1.0))
        store.append_incident(incident("b", 1, 1.0))
        assert store.incidents("a") == []  # nothing flushed yet
        store.flush()
        assert [i["updated"] for i in store.incidents("a")] == [1.0]
        assert [i["updated"] for i in store.incidents("a")] == [1.0]
        assert decoded == ["a", "a"]  # the read before the flush, and the first after
        store.append_incident(incident("b", 1, 2.0))
        store.flush()
        store.incidents("a")
        assert decoded == ["a", "a"]  # b's judgement leaves a's decoded incidents
        store.append_incident(incident("a", 1, 3.0))
        store.append_incident(incident("a", 2, 3.5))
        store.flush()
        got = [(i["id"], i["updated"]) for i in store.incidents("a")]
        assert got == [("a#1", 3.0), ("a#2", 3.5)]
        assert [i["updated"] for i in store.incidents("b")] == [2.0]
    finally:
        store.close()
    again = Store(tmp_path / "s.duckdb")  # a new process: decoded from disk
    try:
        assert [i["id"] for i in again.incidents("a")] == ["a#1", "a#2"]
    finally:
        again.close()
