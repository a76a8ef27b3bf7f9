"""How the msrun tests launch the real 4-rank MindSpore job (demo/train_mindspore.py).

The labels job (rank 2 flagged alone, every rank's JSONL equal to the store) and the crash job
(crashed and lost ranks) are checked in test_incidents_msrun.py, on the same job as their
incident: one msrun job per fault.
"""

from __future__ import annotations

from pathlib import Path

from .conftest import free_port

TRAIN = Path(__file__).resolve().parents[2] / "demo" / "train_mindspore.py"
RANKS = 4


def msrun_command(msrun: str, tmp_path: Path, *train_args: str) -> list[str]:
    return [
        msrun, f"--worker_num={RANKS}", f"--local_worker_num={RANKS}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        f"--log_dir={tmp_path / 'msrun'}", "--join=True", str(TRAIN), *train_args,
    ]  # fmt: skip
