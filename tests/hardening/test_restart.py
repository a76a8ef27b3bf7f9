"""The aggregator is killed with SIGKILL mid-run, twice, and restarted on the same data dir
and ports: the ranks (real Monitor processes) reconnect by themselves, and what the dead
aggregator never stored comes back through resend requests, with nobody acting. In the end the
store holds exactly the union of the ranks' JSONL files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Spawner
from .procs import compare, read_jsonl, read_store, wait_until

pytestmark = pytest.mark.timeout(120)

RUN = "restart-kill9"
WORLD = 4
INTERVAL_S = 0.02  # 50 steps/s per rank
KILLS = 2


def _last_steps(serve: Any) -> dict[int, int]:
    entry = serve.run_entry(RUN) or {}
    return {row["rank"]: row.get("last_step") or 0 for row in entry.get("ranks") or []}


def _gap_total(serve: Any) -> int:
    entry = serve.run_entry(RUN) or {}
    return sum(hi - lo + 1 for row in entry.get("ranks") or [] for lo, hi in row["gaps"])


def _rows(serve: Any) -> str:
    entry = serve.run_entry(RUN) or {}
    lines = [
        f"rank {r['rank']}: {r['state']} last_step {r['last_step']} gaps {r['gaps'][:5]}"
        for r in entry.get("ranks") or []
    ]
    return "\n".join([*lines, serve.tail()])


def test_aggregator_kill_9_and_restart_loses_nothing(
    spawn: Spawner, tmp_path: Path, report: Any
) -> None:
    serve = spawn.serve(tmp_path / "data")
    stop = tmp_path / "stop"
    logs = tmp_path / "logs"
    ranks = [
        spawn.rank(RUN, k, WORLD, serve.addr, logs, interval=INTERVAL_S, stop_file=stop)
        for k in range(WORLD)
    ]
    missing_at_restart = []
    backfill_s = []
    for _ in range(KILLS):
        floor = min(_last_steps(serve).values(), default=0)
        wait_until(
            "every rank to be heard from",
            lambda s=serve, f=floor: (
                len(steps := _last_steps(s)) == WORLD and min(steps.values()) >= f + 40
            ),
            60,
        )
        killed_at = max(_last_steps(serve).values())
        serve.kill9()
        time.sleep(1.0)  # the ranks go on logging into the void
        serve = spawn.restart(serve)
        assert all(r.proc.poll() is None for r in ranks), "a rank died with the aggregator"
        restarted = time.monotonic()
        # The gaps show once a rank's first record reaches the new aggregator; then the
        # aggregator asks for them and they fill in, with nobody acting.
        wait_until(
            "fresh records at the new aggregator",
            lambda s=serve, k=killed_at: (
                len(t := _last_steps(s)) == WORLD and min(t.values()) > k + 20
            ),
            30,
        )
        seen = _gap_total(serve)
        wait_until(
            "the gaps to be backfilled",
            lambda s=serve: len(_last_steps(s)) == WORLD and _gap_total(s) == 0,
            30, 0.2, lambda s=serve: _rows(s),
        )  # fmt: skip
        missing_at_restart.append(seen)
        backfill_s.append(round(time.monotonic() - restarted, 1))
    stop.touch()
    assert [r.wait(30) for r in ranks] == [0] * WORLD

    def settled() -> bool:
        entry = serve.run_entry(RUN) or {}
        rows = entry.get("ranks") or []
        return len(rows) == WORLD and all(
            row["state"] == "finished" and not row["gaps"] for row in rows
        )

    wait_until("every rank finished with no seq gaps", settled, 60, 0.25, lambda: _rows(serve))
    assert serve.stop() == 0
    resends = sum(s.output().count("to resend from seq") for s in spawn.serves)
    written = read_jsonl(logs / RUN)
    stored = read_store(tmp_path / "data", RUN)
    result = compare(stored, written)
    report(
        kind="fault",
        what=f"aggregator kill -9 mid-run x{KILLS}, restart on same data dir and ports",
        ranks=WORLD,
        resend_requests=resends,
        missing_at_restart=missing_at_restart,
        backfill_s=backfill_s,
        **result,
        result="ranks reconnected, gaps resent" if result["missing"] == 0 else "LOST RECORDS",
    )
    assert result["written"] > WORLD * 100
    assert result == {**result, "missing": 0, "extra": 0, "differ": 0}
