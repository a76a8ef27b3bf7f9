"""`rankwatch import` takes the stacks file the agent's faulthandler watchdog wrote beside a
rank's JSONL as that rank's last stack sample: a real Monitor in its own process (aggregator
absent), stuck longer than its ``stack_dump_s``, then the real console script."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rankwatch.aggregator.store.db import Store

from tests.cli.running import cli, free_port

RANK = """
import sys, time
from rankwatch.agent.monitor import Monitor

mon = Monitor(run="dumped", rank=3, world_size=4, addr=sys.argv[1], log_dir=sys.argv[2],
              heartbeat_s=0.2, stack_dump_s=0.4)
for step in range(1, 6):
    mon.log(step, loss=1.0)

def wait_for_the_batch():
    time.sleep(1.5)  # stuck: the watchdog writes every thread's stack meanwhile

wait_for_the_batch()
mon.close()
"""


def test_import_reads_the_watchdog_file_as_the_ranks_last_sample(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    logs = tmp_path / "logs"
    addr = f"tcp://127.0.0.1:{free_port()}"  # nobody listens: the agent keeps its file
    done = subprocess.run(
        [sys.executable, str(script), addr, str(logs)], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    dump = logs / "dumped" / "rank3.stacks.txt"
    assert "wait_for_the_batch" in dump.read_text()
    result = cli("import", str(logs), "--data", str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    assert "rank3.stacks.txt: rank 3's last stack sample (user)" in result.stdout
    with Store(tmp_path / "data") as store:
        sample = store.stacks("dumped")[3]
    assert sample["step"] == 5
    assert sample["frames"][0][2] == "wait_for_the_batch"
    assert sample["frames"][0][0].endswith("rank.py")
    assert sample["note"].startswith("faulthandler dump")
    assert len(sample["signature"]) == 16


def test_import_keeps_the_stack_samples_of_heartbeats(tmp_path: Path) -> None:
    """A JSONL whose heartbeats carry stacks (a rank that stalled while its aggregator was away):
    the latest becomes the rank's stack sample in the store."""
    from rankwatch.agent.wire.records import Heartbeat, to_json_line
    from rankwatch.agent.wire.stacks import Frame, StackSample

    def beat(seq: int, line: int) -> str:
        sample = StackSample("user", "ab" * 8, (Frame("job/train.py", line, "load"),), 7, seq)
        return to_json_line(Heartbeat("beats", 1, seq, float(seq), 7, 5.0, 0, stack=sample))

    (tmp_path / "beats").mkdir()
    (tmp_path / "beats" / "rank1.jsonl").write_text(beat(1, 10) + beat(2, 11))
    result = cli("import", str(tmp_path / "beats"), "--data", str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    with Store(tmp_path / "data") as store:
        assert store.stacks("beats")[1]["frames"] == [["job/train.py", 11, "load"]]
