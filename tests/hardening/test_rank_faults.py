"""A rank killed with SIGKILL is reported lost within the serve's lost timeout; a rank frozen
with SIGSTOP (hung) is reported stalled and comes back alive on SIGCONT. The other ranks stay
alive throughout and nothing they sent is lost."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from rankwatch.aggregator.health import LOST_MARGIN_S

from .conftest import Spawner
from .procs import SERVE, compare, read_jsonl, read_store, wait_until

RUN = "rank-faults"
WORLD = 3
HEARTBEAT_S = 0.5
LOST_AFTER_S = 2.0
VICTIM = 1
STALL_S = 2.0  # --min-stall-s for the frozen rank (the default, 30 s, would make a slow test)


def _config(path: Path, **keys: float) -> list[str]:
    path.write_text("[serve]\n" + "".join(f"{k} = {float(v)}\n" for k, v in keys.items()))
    return ["--config", str(path)]


def _start(
    spawn: Spawner, tmp_path: Path, *flags: str, **keys: float
) -> tuple[Any, list[Any], Path]:
    serve = spawn.serve(extra=[*_config(tmp_path / "serve.toml", **keys), *flags])
    stop = tmp_path / "stop"
    logs = tmp_path / "logs"
    ranks = [
        spawn.rank(RUN, k, WORLD, serve.addr, logs, heartbeat=HEARTBEAT_S, stop_file=stop)
        for k in range(WORLD)
    ]
    wait_until(
        "every rank alive",
        lambda: serve.rank_states(RUN) == dict.fromkeys(range(WORLD), "alive"),
        60,
    )
    return serve, ranks, stop


def _finish(
    serve: Any, ranks: list[Any], stop: Path, tmp_path: Path, alive: list[int]
) -> dict[str, int]:
    """Stop the ranks still running, import the JSONL files into the live serve (what a rank
    logged in the last instant before a SIGKILL never left it), then compare with the store."""
    stop.touch()
    assert [ranks[k].wait(30) for k in alive] == [0] * len(alive)
    wait_until(
        "the surviving ranks to finish",
        lambda: all(serve.rank_states(RUN).get(k) == "finished" for k in alive),
        30,
    )
    done = subprocess.run(
        [*SERVE, "import", str(tmp_path / "logs" / RUN), "--url", serve.url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.search(r"imported (\d+) new records", done.stdout)
    assert found is not None, done.stdout
    assert serve.stop() == 0  # flushes what the import added
    result = compare(read_store(serve.data, RUN), read_jsonl(tmp_path / "logs" / RUN))
    return {**result, "recovered_by_import": int(found.group(1))}


@pytest.mark.timeout(90)
def test_a_killed_rank_is_lost_within_the_timeout(
    spawn: Spawner, tmp_path: Path, report: Any
) -> None:
    serve, ranks, stop = _start(spawn, tmp_path, lost_after_s=LOST_AFTER_S)
    ranks[VICTIM].signal(signal.SIGKILL)
    killed = time.monotonic()
    ranks[VICTIM].wait(10)
    # A heartbeat announces the next one; the limit is the larger of the two.
    limit = max(LOST_AFTER_S, 2 * HEARTBEAT_S + LOST_MARGIN_S)
    wait_until("the killed rank to be lost", lambda: serve.rank_states(RUN)[VICTIM] == "lost",
               limit + 5)  # fmt: skip
    detected = time.monotonic() - killed
    states = serve.rank_states(RUN)
    assert {k: v for k, v in states.items() if k != VICTIM} == {0: "alive", 2: "alive"}
    entry = serve.run_entry(RUN) or {}
    assert entry["state"] == "lost"
    result = _finish(serve, ranks, stop, tmp_path, alive=[0, 2])
    report(
        kind="fault", what="rank kill -9", result=f"lost after {detected:.1f} s (limit "
        f"{limit:g} s), other ranks alive; what it logged in its last instant (never sent) "
        "comes back with `rankwatch import` of its JSONL", detected_s=round(detected, 1),
        limit_s=limit, **result,
    )  # fmt: skip
    assert detected <= limit + 2.0
    assert result == {**result, "missing": 0, "extra": 0, "differ": 0}


@pytest.mark.timeout(90)
def test_a_frozen_rank_is_stalled_then_alive_again_on_sigcont(
    spawn: Spawner, tmp_path: Path, report: Any
) -> None:
    # A frozen process sends nothing, not even heartbeats: it is "stalled" once its step has
    # not advanced for min_stall_s, and "lost" only after lost_after_s; keep lost further off.
    serve, ranks, stop = _start(
        spawn, tmp_path, "--min-stall-s", str(STALL_S), lost_after_s=STALL_S + 30
    )
    ranks[VICTIM].signal(signal.SIGSTOP)
    frozen = time.monotonic()
    wait_until(
        "the frozen rank to be stalled",
        lambda: serve.rank_states(RUN)[VICTIM] == "stalled",
        STALL_S + 15,
        0.25,
    )
    detected = time.monotonic() - frozen
    assert serve.rank_states(RUN) == {0: "alive", 1: "stalled", 2: "alive"}
    # The rank logs a step every 0.02 s, so min_stall_s alone sets the limit: the default
    # (30 s) would not have been reached yet.
    assert detected < STALL_S + 5.0
    ranks[VICTIM].signal(signal.SIGCONT)
    resumed = time.monotonic()
    wait_until("the rank to be alive again", lambda: serve.rank_states(RUN)[VICTIM] == "alive", 10)
    back = time.monotonic() - resumed
    result = _finish(serve, ranks, stop, tmp_path, alive=[0, 1, 2])
    report(
        kind="fault", what="rank SIGSTOP (hung), then SIGCONT",
        result=f"stalled after {detected:.1f} s (--min-stall-s {STALL_S:g}), alive "
        f"{back:.1f} s after SIGCONT",
        stalled_s=round(detected, 1), alive_again_s=round(back, 1), **result,
    )  # fmt: skip
    assert result == {**result, "missing": 0, "extra": 0, "differ": 0}
