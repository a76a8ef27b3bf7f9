"""Full disks: the aggregator's data directory, and a rank's JSONL directory.

Each test mounts a small tmpfs (root only; skipped otherwise) and fills it with a file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rankwatch.aggregator.service import STORE_RETRY_S

from .conftest import Spawner, fill
from .procs import Stream, compare, read_jsonl, read_store, wait_until

pytestmark = pytest.mark.timeout(120)

WORLD = 2


def _stored(serve: Any, run: str) -> int:
    runs = serve.get("/api/runs").get("runs") or []
    return next((r.get("records") or 0 for r in runs if r.get("run") == run), 0)


def _live_step(serve: Any, run: str) -> int:
    entry = serve.run_entry(run) or {}
    return min((row.get("last_step") or 0 for row in entry.get("ranks") or []), default=0)


def test_a_full_data_dir_is_logged_the_live_view_goes_on_and_it_recovers(
    spawn: Spawner, tmp_path: Path, tmpfs: Callable[[Path, str], Path], report: Any
) -> None:
    run = "store-full"
    data = tmpfs(tmp_path / "data", "8m")
    serve = spawn.serve(data)
    stop = tmp_path / "stop"
    logs = tmp_path / "logs"
    ranks = [spawn.rank(run, k, WORLD, serve.addr, logs, stop_file=stop) for k in range(WORLD)]
    wait_until("records stored", lambda: _stored(serve, run) > 200, 60)
    stream = Stream(serve, run)
    try:
        filler = fill(data)
        filled = time.monotonic()
        wait_until(
            "the store error to be logged",
            lambda: "cannot write the store" in serve.output(),
            STORE_RETRY_S + 10,
            detail=serve.tail,
        )
        frozen = _stored(serve, run)
        step_then, stream_then = _live_step(serve, run), stream.highest()
        time.sleep(2.0)
        # The live view and the feed go on while nothing can be written.
        assert _live_step(serve, run) > step_then + 20
        wait_until("the feed to go on", lambda: stream.highest() > stream_then + 20, 10)
        assert _stored(serve, run) == frozen, "records were stored on a full disk?"
        assert serve.output().count("cannot write the store") == 1, "logged more than once"
        full_for = time.monotonic() - filled
        filler.unlink()
        freed = time.monotonic()
        wait_until(
            "the store to recover",
            lambda: _stored(serve, run) > frozen + 100,
            STORE_RETRY_S + 15,
            detail=serve.tail,
        )
        recovered = time.monotonic() - freed
        # The flush that stores the backlog settles its bands before it returns and the
        # recovery is logged: the records can be readable a moment before the line is written.
        wait_until(
            "the recovery to be logged",
            lambda: "store is writable again" in serve.output(),
            10,
            detail=serve.tail,
        )
        assert stream.error is None, f"the live stream broke: {stream.error!r}"
    finally:
        stream.close()
    stop.touch()
    assert [r.wait(30) for r in ranks] == [0] * WORLD
    wait_until(
        "the ranks to finish",
        lambda: serve.rank_states(run) == dict.fromkeys(range(WORLD), "finished"),
        30,
    )
    assert serve.stop() == 0
    # The store reopens (no corruption) and holds every record the ranks wrote.
    result = compare(read_store(data, run), read_jsonl(logs / run))
    report(
        kind="fault", what="aggregator data dir full (8 MB tmpfs filled), then space freed",
        result=f"error logged once, live view and feed went on, stored again {recovered:.1f} s "
        "after space returned; store reopens", full_s=round(full_for, 1),
        recovered_s=round(recovered, 1), **result,
    )  # fmt: skip
    assert result == {**result, "missing": 0, "extra": 0, "differ": 0}


def test_a_full_jsonl_dir_warns_once_and_training_goes_on(
    spawn: Spawner, tmp_path: Path, tmpfs: Callable[[Path, str], Path], report: Any
) -> None:
    run = "jsonl-full"
    steps = 1500
    logs = tmpfs(tmp_path / "logs", "1m")
    serve = spawn.serve()
    # The rank's output goes next to (not into) the directory that fills up.
    rank = spawn.rank(run, 0, 1, serve.addr, logs, steps=steps, interval=0.005)
    wait_until("the rank to log", lambda: _live_step(serve, run) > 200, 60)
    filler = fill(logs)
    filled_at = _live_step(serve, run)
    assert rank.wait(60) == 0, rank.output()
    filler.unlink()
    wait_until("the rank to finish", lambda: serve.rank_states(run) == {0: "finished"}, 30)
    entry = serve.run_entry(run) or {}
    assert entry["last_step"] == steps
    assert serve.stop() == 0
    out = rank.output()
    warnings = [line for line in out.splitlines() if "cannot write" in line]
    assert len(warnings) == 1, out[-2000:]
    assert f"done {steps}" in out
    stored = read_store(serve.data, run)
    stored_steps = sum(1 for text in stored.values() if '"kind": "step"' in text)
    kept = len((logs / run / "rank0.jsonl").read_bytes().splitlines())
    report(
        kind="fault", what="rank JSONL dir full (1 MB tmpfs filled mid-run)",
        result="training finished, one warning, every record still reached the aggregator",
        warnings=len(warnings), steps=steps, stored_steps=stored_steps, full_from_step=filled_at,
        jsonl_lines=kept,
    )  # fmt: skip
    assert stored_steps == steps
    assert 100 < kept < steps  # the file has what fitted, the aggregator has it all
