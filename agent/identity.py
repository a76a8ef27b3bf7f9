"""Who this rank is: run name, rank, world size and aggregator address, from the launcher's env.

Every value has the same order of precedence: an explicit argument, then a ``RANKWATCH_*``
variable, then what the launcher (msrun, torchrun, a batch scheduler) put in the environment,
then a default. Bad values raise ``ValueError`` here, at construction, and nowhere else.

Rank and world size
    ``RANK_ID``/``RANK_SIZE`` (msrun), else ``RANK``/``WORLD_SIZE`` (torchrun), else rank 0 of 1.

Run name
    ``RANKWATCH_RUN`` if set. Otherwise a name all ranks of one launch derive alike, with no
    coordination, while two launches never share one, made to be read:
    ``<script stem>-<MMDD>-<HHMM>-<suffix>``, the launch's start (UTC) and 4 hex digits of a
    hash of what identifies the launch (``torch_ddp-1201-2247-3fa2``). The start is one every
    rank sees alike:

    1. A Slurm job's ``SLURM_JOB_START_TIME``; the hash is of the job and step ids.
    2. A torchrun launch on one node (``GROUP_WORLD_SIZE`` 1, or ``LOCAL_WORLD_SIZE`` equal to
       ``WORLD_SIZE``; ``--standalone`` is one): torchrun's own start, read from
       ``/proc/<ppid>/stat`` (torchrun is the parent of every local rank, and stays the parent
       across its rank restarts); the hash is of ``TORCHELASTIC_RUN_ID`` and that process.
    3. Another launcher job id (``TORCHELASTIC_RUN_ID`` unless it is ``"none"``, ``SLURM_JOB_ID``
       with ``SLURM_STEP_ID``, ``PBS_JOBID``, ``LSB_JOBID``) with no start every node shares:
       the id itself, which is the same on every node, in place of the start:
       ``train-12345-3fa2`` (the id, shortened, then the hash).
    4. A head address (``MS_SCHED_HOST:MS_SCHED_PORT`` or ``MASTER_ADDR:MASTER_PORT``): the
       launcher process (this process's parent: msrun or torchrun) and its start time, which
       all local ranks of one launch share; the hash is of head address, host, launcher pid and
       start.
    5. Otherwise this process alone (pid and start time): a single-process run.

    Without ``/proc`` (no launcher start known) the stamp is ``launch``: ``train-launch-3fa2``.
    Two launches of one script on one host in the same minute differ in the hash (1 in 65,536
    collide).

    Caveat: in case 4 ranks on *different* nodes have different launcher processes, so a
    multi-node launch with no job id gets one run name per node. Such a launch must set
    ``RANKWATCH_RUN`` (the deploy wrappers do). Likewise two launches inside one batch job
    step share the job id: set ``RANKWATCH_RUN`` for each.

Aggregator address
    ``RANKWATCH_ADDR``, else the head node (``MS_SCHED_HOST`` or ``MASTER_ADDR``) at
    ``DEFAULT_INGEST_PORT``, else none (JSONL only). Accepted forms: ``host``, ``host:port``,
    ``tcp://host:port``, ``[::1]:port``, ``ipc://path``.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .wire.addresses import head_address, resolve_addr
from .wire.records import MAX_NAME_CHARS

DEFAULT_LOG_DIR = "rankwatch_logs"
HASH_CHARS = 4  # hex digits of the launch hash in a derived run name
JOB_ID_CHARS = 12  # a job id is shortened to this in a derived run name
STEM_CHARS = 64  # script stem is shortened to this in a derived run name

# Launcher job ids, most specific first: torchrun's rendezvous id is fresh per launch with
# --standalone, while a scheduler id is shared by every launch inside one allocation.
JOB_ID_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
# Environment recorded in the start event: enough to tell how the rank was launched.
INFO_VARS = (
    "RANK_ID",
    "RANK_SIZE",
    "DEVICE_ID",
    "MS_ROLE",
    "MS_NODE_ID",
    "MS_WORKER_NUM",
    "MS_SCHED_HOST",
    "MS_SCHED_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_START_TIME",
    "PBS_JOBID",
    "LSB_JOBID",
    "RANKWATCH_RUN",
    "RANKWATCH_ADDR",
    "RANKWATCH_LOG_DIR",
)

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Identity:
    """Everything constant about one rank, resolved once at construction."""

    run: str
    rank: int
    world_size: int
    addr: str | None  # a ZeroMQ endpoint, or None for JSONL only
    log_dir: Path
    launcher: str  # "msrun", "torchrun" or "none"
    head: str | None  # head node "host:port", when the launcher named one
    host: str
    pid: int
    info: dict[str, Any] = field(default_factory=dict)  # the start event's info


def launcher_name(env: Mapping[str, str]) -> str:
    if "RANK_ID" in env or "MS_SCHED_HOST" in env or "MS_ROLE" in env:
        return "msrun"
    if "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env:
        return "torchrun"
    return "none"


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int, got {value!r}")
    if not isinstance(value, int):
        try:
            value = int(value.__index__())
        except (AttributeError, TypeError):
            raise ValueError(f"{what} must be an int, got {value!r}") from None
    return int(value)


def resolve_rank(
    rank: int | None, world_size: int | None, env: Mapping[str, str]
) -> tuple[int, int]:
    """(rank, world_size): explicit arguments win, then msrun's, then torchrun's variables."""
    env_rank, env_world, source = None, None, "default"
    for rank_var, world_var in (("RANK_ID", "RANK_SIZE"), ("RANK", "WORLD_SIZE")):
        if rank_var in env or world_var in env:
            env_rank, env_world = _env_int(env, rank_var), _env_int(env, world_var)
            source = f"{rank_var}/{world_var}"
            if env_world is None and rank_var == "RANK_ID":
                env_world = _env_int(env, "MS_WORKER_NUM")
            break
    r = _check_int(rank, "rank") if rank is not None else (env_rank or 0)
    if world_size is not None:
        w = _check_int(world_size, "world_size")
    elif env_world is not None:
        w = env_world
    else:
        w = max(1, r + 1) if rank is None and env_rank is not None else 1
    if r < 0:
        raise ValueError(f"rank must be >= 0, got {r} (from {source})")
    if w < 1:
        raise ValueError(f"world_size must be >= 1, got {w} (from {source})")
    if r >= w:
        raise ValueError(f"rank {r} is not below world_size {w} (from {source})")
    return r, w


def check_run_name(run: Any) -> str:
    if not isinstance(run, str) or not run.strip():
        raise ValueError(f"run name must be a non-empty string, got {run!r}")
    run = run.strip()
    if len(run) > MAX_NAME_CHARS:
        raise ValueError(f"run name is {len(run)} chars, max {MAX_NAME_CHARS}: {run[:40]!r}...")
    try:
        run.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"run name {run[:40]!r} is not valid UTF-8") from None
    return run


def safe_filename(name: str, limit: int = 128) -> str:
    """``name`` as one safe path component: no separators, no leading dot, never empty."""
    out = _SAFE.sub("_", name).lstrip(".")[:limit] or "run"
    if out != name:
        # Two names that sanitise alike must still get two folders.
        out = f"{out[: limit - 9]}-{hashlib.sha1(name.encode('utf-8', 'replace')).hexdigest()[:8]}"
    return out


def script_stem(argv: Sequence[str]) -> str:
    """The training script's name (``train`` for ``python train.py``; ``python`` for ``-c``)."""
    first = argv[0] if argv else ""
    if not first or first in ("-c", "-m", "-"):
        return "python"
    path = Path(first)
    stem = path.stem
    if stem == "__main__":  # python -m package
        stem = path.parent.name or "python"
    return _SAFE.sub("_", stem).strip("._-")[:STEM_CHARS] or "python"


def _hash(*parts: object) -> str:
    text = "\0".join(str(p) for p in parts)
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:HASH_CHARS]


def _stamp(wall: float | None) -> str:
    return time.strftime("%m%d-%H%M", time.gmtime(wall)) if wall is not None else "launch"


def _one_node(env: Mapping[str, str]) -> bool:
    """torchrun's variables say every rank of the launch runs on this node."""
    groups, local, world = (
        env.get(k, "").strip() for k in ("GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
    )
    return groups == "1" or (local != "" and local == world)


def _slurm_start(env: Mapping[str, str]) -> float | None:
    raw = env.get("SLURM_JOB_START_TIME", "").strip()
    return float(raw) if raw.isdigit() else None


def derive_run(
    env: Mapping[str, str],
    stem: str,
    host: str,
    own: tuple[int, int | None, float],
    parent: tuple[int, int | None, float | None],
) -> str:
    """A run name all ranks of one launch agree on; see the module docstring.

    ``own`` and ``parent`` are ``(pid, start in clock ticks or None, start as Unix time)``.
    """
    ppid, pticks, pwall = parent
    for var in JOB_ID_VARS:
        job = env.get(var, "").strip()
        if not job or (var == "TORCHELASTIC_RUN_ID" and job == "none"):
            continue
        step = env.get("SLURM_STEP_ID", "") if var == "SLURM_JOB_ID" else ""
        slurm_start = _slurm_start(env) if var == "SLURM_JOB_ID" else None
        if slurm_start is not None:
            return f"{stem}-{_stamp(slurm_start)}-{_hash(var, job, step)}"
        if var == "TORCHELASTIC_RUN_ID" and _one_node(env) and pwall is not None:
            return f"{stem}-{_stamp(pwall)}-{_hash(var, job, host, ppid, pticks)}"
        short = _SAFE.sub("_", job).strip("._-")[:JOB_ID_CHARS] or "job"
        return f"{stem}-{short}-{_hash(var, job, step)}"
    head = head_address(env)
    if head is not None:
        return f"{stem}-{_stamp(pwall)}-{_hash(head, host, ppid, pticks)}"
    pid, ticks, wall = own
    return f"{stem}-{_stamp(wall)}-{_hash(host, pid, ticks, wall if ticks is None else '')}"


def process_start(pid: int, proc: Path = Path("/proc")) -> tuple[int | None, float | None]:
    """(start in clock ticks since boot, start as Unix time) of ``pid``; Nones off Linux."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        # Field 2 (comm) may hold spaces and parentheses: fields restart after the last ')'.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        btime = 0
        for line in (proc / "stat").read_text().splitlines():
            if line.startswith("btime "):
                btime = int(line.split()[1])
        return ticks, btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None, None


def resolve(
    run: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    addr: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> Identity:
    """Resolve everything at once from the real process (``env``/``argv`` default to it)."""
    env = os.environ if env is None else env
    argv = sys.argv if argv is None else argv
    r, w = resolve_rank(rank, world_size, env)
    host, pid, ppid = socket.gethostname(), os.getpid(), os.getppid()
    if run is None and env.get("RANKWATCH_RUN", "").strip():
        run = env["RANKWATCH_RUN"]
    if run is None:
        ticks, wall = process_start(pid)
        pticks, pwall = process_start(ppid)
        run = derive_run(
            env,
            script_stem(argv),
            host,
            (pid, ticks, wall if wall is not None else _process_t0()),
            (ppid, pticks, pwall),
        )
    run = check_run_name(run)
    if log_dir is None:
        log_dir = env.get("RANKWATCH_LOG_DIR", "").strip() or DEFAULT_LOG_DIR
    head = head_address(env)
    launcher = launcher_name(env)
    info: dict[str, Any] = {
        "launcher": launcher,
        "head": head,
        "host": host,
        "pid": pid,
        "ppid": ppid,
        "python": sys.version.split()[0],
        "argv": [str(a)[:MAX_NAME_CHARS] for a in list(argv)[:64]],
        "env": {k: env[k] for k in INFO_VARS if k in env},
    }
    return Identity(
        run=run,
        rank=r,
        world_size=w,
        addr=resolve_addr(addr, env),
        log_dir=Path(log_dir),
        launcher=launcher,
        head=head,
        host=host[:MAX_NAME_CHARS],
        pid=pid,
        info=info,
    )


_T0 = time.time()


def _process_t0() -> float:
    """Off Linux, the time this module was imported stands in for the process start."""
    return _T0
