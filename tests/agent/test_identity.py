"""Identity resolution: table-driven, env passed in as dicts."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from rankwatch.agent.identity import (
    derive_run,
    launcher_name,
    process_start,
    resolve,
    resolve_rank,
    safe_filename,
    script_stem,
)
from rankwatch.agent.wire.addresses import DEFAULT_INGEST_PORT, parse_addr, resolve_addr

MSRUN = {"RANK_ID": "3", "RANK_SIZE": "4", "MS_SCHED_HOST": "10.0.0.1", "MS_SCHED_PORT": "8118"}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0"}
# torchrun --standalone --nproc-per-node 4, as a worker sees it
TORCHRUN_1 = {
    "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "1c8e35d8-513b-4b9e-a3f1-6b0e5e1a2c77",
    "TORCHELASTIC_RESTART_COUNT": "0",
}  # fmt: skip


@pytest.mark.parametrize(
    ("rank", "world", "env", "expected"),
    [
        (None, None, {}, (0, 1)),
        (None, None, MSRUN, (3, 4)),
        (None, None, TORCHRUN, (5, 8)),
        (None, None, {**TORCHRUN, **MSRUN}, (3, 4)),  # msrun's variables are checked first
        (1, 2, MSRUN, (1, 2)),  # explicit wins
        (2, None, MSRUN, (2, 4)),
        (None, 16, TORCHRUN, (5, 16)),
        (None, None, {"RANK_ID": "2", "MS_WORKER_NUM": "4"}, (2, 4)),
        (None, None, {"RANK": "3"}, (3, 4)),  # no world size: at least rank + 1
        (None, None, {"RANK": " 0 ", "WORLD_SIZE": "2"}, (0, 2)),
        (None, None, {"RANK": "", "WORLD_SIZE": "2"}, (0, 2)),
    ],
)
def test_resolve_rank(
    rank: int | None, world: int | None, env: dict[str, str], expected: tuple[int, int]
) -> None:
    assert resolve_rank(rank, world, env) == expected


@pytest.mark.parametrize(
    ("rank", "world", "env", "message"),
    [
        (None, None, {"RANK_ID": "x", "RANK_SIZE": "4"}, "RANK_ID='x' is not an integer"),
        (None, None, {"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
        (4, 4, {}, "rank 4 is not below world_size 4"),
        (-1, None, {}, "rank must be >= 0"),
        (0, 0, {}, "world_size must be >= 1"),
        ("1", None, {}, "rank must be an int"),
        (True, None, {}, "rank must be an int"),
        (None, None, {"RANK_ID": "4", "RANK_SIZE": "4"}, "(from RANK_ID/RANK_SIZE)"),
    ],
)
def test_resolve_rank_errors(
    rank: object, world: object, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_rank(rank, world, env)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "endpoint"),
    [
        ("head", f"tcp://head:{DEFAULT_INGEST_PORT}"),
        ("head:9000", "tcp://head:9000"),
        ("tcp://10.1.2.3:9000", "tcp://10.1.2.3:9000"),
        ("tcp://head", f"tcp://head:{DEFAULT_INGEST_PORT}"),
        ("[::1]:9000", "tcp://[::1]:9000"),
        ("[fe80::1]", f"tcp://[fe80::1]:{DEFAULT_INGEST_PORT}"),
        ("tcp://[::1]:1", "tcp://[::1]:1"),
        ("  node-7.cluster.local:65535 ", "tcp://node-7.cluster.local:65535"),
        ("ipc:///tmp/rw.sock", "ipc:///tmp/rw.sock"),
    ],
)
def test_parse_addr(value: str, endpoint: str) -> None:
    assert parse_addr(value) == endpoint


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "non-empty"),
        ("head:", "empty port"),
        ("head:0", "bad port '0'"),
        ("head:70000", "bad port"),
        ("head:http", "bad port 'http'"),
        ("udp://head:1", "only tcp:// and ipc://"),
        ("::1:9000", "[addr]:port"),
        ("[::1", "unclosed"),
        ("[::1]x", "expected ':port'"),
        ("[zz]:1", "bad IPv6"),
        ("he ad:1", "bad host name"),
        ("ipc://", "no path"),
        (":9000", "bad host name"),
    ],
)
def test_parse_addr_errors(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_addr(value)


@pytest.mark.parametrize(
    ("addr", "env", "expected"),
    [
        (None, {}, None),
        (None, MSRUN, f"tcp://10.0.0.1:{DEFAULT_INGEST_PORT}"),
        (None, TORCHRUN, f"tcp://node0:{DEFAULT_INGEST_PORT}"),
        (None, {"MASTER_ADDR": "::1"}, f"tcp://[::1]:{DEFAULT_INGEST_PORT}"),
        (None, {**MSRUN, "RANKWATCH_ADDR": "mon:1234"}, "tcp://mon:1234"),
        ("x:1", {**MSRUN, "RANKWATCH_ADDR": "mon:1234"}, "tcp://x:1"),
        (None, {"RANKWATCH_ADDR": "  "}, None),
    ],
)
def test_resolve_addr(addr: str | None, env: dict[str, str], expected: str | None) -> None:
    assert resolve_addr(addr, env) == expected


def test_resolve_addr_names_the_bad_variable() -> None:
    with pytest.raises(ValueError, match=r"RANKWATCH_ADDR: .*bad port"):
        resolve_addr(None, {"RANKWATCH_ADDR": "h:x"})


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "none"), (MSRUN, "msrun"), (TORCHRUN, "torchrun"), ({"MS_ROLE": "MS_WORKER"}, "msrun")],
)
def test_launcher_name(env: dict[str, str], expected: str) -> None:
    assert launcher_name(env) == expected


@pytest.mark.parametrize(
    ("argv", "stem"),
    [
        (["train.py"], "train"),
        (["/a/b/pretrain_gpt.py", "--x"], "pretrain_gpt"),
        (["-c"], "python"),
        ([], "python"),
        ([""], "python"),
        (["/site/mypkg/__main__.py"], "mypkg"),
        (["my train!.py"], "my_train"),
        (["x" * 200 + ".py"], "x" * 64),
    ],
)
def test_script_stem(argv: list[str], stem: str) -> None:
    assert script_stem(argv) == stem


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("train-20261129-2130-3fa2c1", r"train-20261129-2130-3fa2c1"),
        ("a/b", r"a_b-[0-9a-f]{8}"),
        ("..", r"run-[0-9a-f]{8}"),
        ("", r"run-[0-9a-f]{8}"),
        ("../../etc", r"_.._etc-[0-9a-f]{8}|_etc-[0-9a-f]{8}"),
        ("résumé run", r"r_sum_run-[0-9a-f]{8}"),
        ("x" * 300, r"x{119}-[0-9a-f]{8}"),
    ],
)
def test_safe_filename(name: str, pattern: str) -> None:
    safe = safe_filename(name)
    assert re.fullmatch(pattern, safe), safe
    assert "/" not in safe and not safe.startswith(".")


def test_safe_filename_keeps_distinct_names_distinct() -> None:
    assert safe_filename("a/b") != safe_filename("a_b")
    assert safe_filename("a?b") != safe_filename("a*b")


OWN = (4242, 1000, 1_795_987_800.0)
SLURM_START = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_JOB_START_TIME": "1795987000"}
PARENT = (4200, 900, 1_795_987_799.0)
HOST = "node0"


@pytest.mark.parametrize(
    ("env", "pattern"),
    [
        ({"SLURM_JOB_ID": "12345"}, r"train-12345-[0-9a-f]{4}"),
        # the job's start, which Slurm gives every node alike
        (
            {"SLURM_JOB_ID": "12345", "SLURM_JOB_START_TIME": "1795987000"},
            r"train-1129-2116-[0-9a-f]{4}",
        ),
        ({"TORCHELASTIC_RUN_ID": "none", "PBS_JOBID": "77.pbs"}, r"train-77.pbs-[0-9a-f]{4}"),
        # a rendezvous id over several nodes: no start they share, the id stands in
        ({"TORCHELASTIC_RUN_ID": "3f9c0e1a-aaaa-bbbb"}, r"train-3f9c0e1a-aaa-[0-9a-f]{4}"),
        (
            {**TORCHRUN, "TORCHELASTIC_RUN_ID": "exp7", "GROUP_WORLD_SIZE": "2"},
            r"train-exp7-[0-9a-f]{4}",
        ),
        # torchrun --standalone: one node, torchrun's own start (UTC)
        ({**TORCHRUN_1, "TORCHELASTIC_RUN_ID": "1c8e35d8-513"}, r"train-1129-2129-[0-9a-f]{4}"),
        (
            {**TORCHRUN, "TORCHELASTIC_RUN_ID": "1c8e35d8", "GROUP_WORLD_SIZE": "1"},
            r"train-1129-2129-[0-9a-f]{4}",
        ),
        ({"LSB_JOBID": "/weird id/"}, r"train-weird_id-[0-9a-f]{4}"),
        (MSRUN, r"train-1129-2129-[0-9a-f]{4}"),  # the launcher's start, UTC
        (TORCHRUN, r"train-1129-2129-[0-9a-f]{4}"),
        ({}, r"train-1129-2130-[0-9a-f]{4}"),  # this process's start
    ],
)
def test_derive_run_format(env: dict[str, str], pattern: str) -> None:
    assert re.fullmatch(pattern, derive_run(env, "train", HOST, OWN, PARENT))


@pytest.mark.parametrize(
    ("env_a", "own_a", "parent_a", "env_b", "own_b", "parent_b", "same"),
    [
        # Two local ranks of one msrun launch: different pids, same launcher process.
        (MSRUN, OWN, PARENT, {**MSRUN, "RANK_ID": "1"}, (4243, 1001, 0.0), PARENT, True),
        # The same head address launched again later: the launcher started at another time.
        (MSRUN, OWN, PARENT, MSRUN, OWN, (4200, 5000, 1_795_990_000.0), False),
        # Same port reused by another launcher process started in the same tick.
        (MSRUN, OWN, PARENT, MSRUN, OWN, (4201, 900, 1_795_987_799.0), False),
        # Another head address.
        (MSRUN, OWN, PARENT, {**MSRUN, "MS_SCHED_PORT": "8119"}, OWN, PARENT, False),
        # One job id on every node, whatever the processes.
        ({"SLURM_JOB_ID": "9"}, OWN, PARENT, {"SLURM_JOB_ID": "9"}, (1, 2, 3.0), (4, 5, 6.0), True),
        # Two srun steps inside one allocation.
        (
            {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0"},
            OWN,
            PARENT,
            {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "1"},
            OWN,
            PARENT,
            False,
        ),
        # Two ranks of one torchrun --standalone: the same torchrun process.
        (
            TORCHRUN_1,
            OWN,
            PARENT,
            {**TORCHRUN_1, "RANK": "2", "LOCAL_RANK": "2"},
            (4244, 1002, 0.0),
            PARENT,
            True,
        ),
        # A rank restarted by torchrun: a new pid and start, the same torchrun, the same name.
        (
            TORCHRUN_1,
            OWN,
            PARENT,
            {**TORCHRUN_1, "TORCHELASTIC_RESTART_COUNT": "1"},
            (5000, 9000, 1_795_988_400.0),
            PARENT,
            True,
        ),
        # torchrun --standalone again, in the same minute: another rendezvous id and process.
        (
            TORCHRUN_1,
            OWN,
            PARENT,
            {**TORCHRUN_1, "TORCHELASTIC_RUN_ID": "77aa"},
            OWN,
            (4300, 950, 1_795_987_801.0),
            False,
        ),
        # Two nodes of one Slurm job with its start time: one name.
        (SLURM_START, OWN, PARENT, SLURM_START, (1, 2, 3.0), (4, 5, 6.0), True),
        # Single processes: one name each.
        ({}, OWN, PARENT, {}, (4243, 1000, OWN[2]), PARENT, False),
        ({}, OWN, PARENT, {}, OWN, (1, 1, 1.0), True),
        # A process without /proc (start ticks unknown) still gets a stable name.
        ({}, (7, None, 5.0), PARENT, {}, (7, None, 5.0), PARENT, True),
    ],
)
def test_derive_run_same_launch_same_name(
    env_a: dict[str, str],
    own_a: tuple[int, int | None, float],
    parent_a: tuple[int, int | None, float | None],
    env_b: dict[str, str],
    own_b: tuple[int, int | None, float],
    parent_b: tuple[int, int | None, float | None],
    same: bool,
) -> None:
    a = derive_run(env_a, "train", HOST, own_a, parent_a)
    b = derive_run(env_b, "train", HOST, own_b, parent_b)
    assert (a == b) is same, (a, b)


def test_derive_run_without_parent_start() -> None:
    name = derive_run(MSRUN, "train", HOST, OWN, (4200, None, None))
    assert re.fullmatch(r"train-launch-[0-9a-f]{4}", name)
    standalone = derive_run(TORCHRUN_1, "train", HOST, OWN, (4200, None, None))
    assert re.fullmatch(r"train-1c8e35d8-513-[0-9a-f]{4}", standalone)  # no start: the id


def test_the_torchrun_example_gets_a_readable_name() -> None:
    """What the issue saw (``torch_ddp-1c8e35d8-513-63bf3e``) is now script, start, suffix."""
    name = derive_run(TORCHRUN_1, "torch_ddp", HOST, OWN, PARENT)
    assert re.fullmatch(r"torch_ddp-1129-2129-[0-9a-f]{4}", name), name
    assert len(name) <= len("torch_ddp-1129-2129-3fa2")


def test_process_start_of_real_processes() -> None:
    own_ticks, own_wall = process_start(os.getpid())
    parent_ticks, parent_wall = process_start(os.getppid())
    assert own_ticks is not None and parent_ticks is not None
    assert own_wall is not None and parent_wall is not None
    assert parent_ticks <= own_ticks
    assert parent_wall <= own_wall <= time.time() + 1
    assert process_start(2**22 + 12345) == (None, None)  # no such process


def test_process_start_reads_comm_with_spaces(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    fields = " ".join(["S", *[str(i) for i in range(4, 22)], "12345", "0"])
    (tmp_path / "77" / "stat").write_text(f"77 (my (odd) name) {fields}\n")
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1000\n")
    ticks, wall = process_start(77, tmp_path)
    assert ticks == 12345
    assert wall == pytest.approx(1000 + 12345 / os.sysconf("SC_CLK_TCK"))


@pytest.mark.parametrize(
    ("kwargs", "env", "run"),
    [
        ({}, {"RANKWATCH_RUN": "exp-1"}, "exp-1"),
        ({"run": "mine"}, {"RANKWATCH_RUN": "exp-1"}, "mine"),
        ({"run": "  padded "}, {}, "padded"),
    ],
)
def test_resolve_run_precedence(kwargs: dict[str, str], env: dict[str, str], run: str) -> None:
    assert resolve(env=env, argv=["train.py"], **kwargs).run == run  # type: ignore[arg-type]


def test_resolve_derives_a_shared_name_for_local_ranks() -> None:
    a = resolve(env={**MSRUN, "RANK_ID": "0"}, argv=["train.py"])
    b = resolve(env={**MSRUN, "RANK_ID": "1"}, argv=["train.py"])
    assert a.run == b.run and a.run.startswith("train-")
    assert (a.rank, b.rank) == (0, 1)


@pytest.mark.parametrize("run", ["", "   ", "x" * 257, 5, "\ud800"])
def test_resolve_rejects_bad_run_names(run: object) -> None:
    with pytest.raises(ValueError, match="run name"):
        resolve(run=run, env={})  # type: ignore[arg-type]


def test_resolve_collects_start_info() -> None:
    ident = resolve(env={**TORCHRUN, "SECRET_TOKEN": "x"}, argv=["train.py", "--lr", "1"])
    assert ident.launcher == "torchrun"
    assert ident.addr == f"tcp://node0:{DEFAULT_INGEST_PORT}"
    assert ident.info["argv"] == ["train.py", "--lr", "1"]
    assert ident.info["env"] == TORCHRUN  # only launcher variables, nothing else
    assert ident.info["pid"] == os.getpid()
    assert ident.log_dir == Path("rankwatch_logs")
    assert resolve(env={"RANKWATCH_LOG_DIR": "/x/y"}).log_dir == Path("/x/y")
