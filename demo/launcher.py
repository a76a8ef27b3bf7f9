"""`rankwatch demo`: an aggregator, a training job with one bad rank, and a clean stop.

The demo starts ``rankwatch serve`` on a demo data directory, then either a real MindSpore
data-parallel job under msrun (``train_mindspore.py``) or simulated ranks (``simulate.py``),
all with ``RANKWATCH_RUN=demo-<timestamp>`` and ``RANKWATCH_ADDR`` pointing at the aggregator.
It prints the dashboard URL, reports flags as the aggregator raises them, and on Ctrl-C (or at
the end with ``--exit-when-done``) stops every process it started.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rankwatch.demo import status
from rankwatch.demo.processes import Processes
from rankwatch.demo.simulate import SimulatedJob, rank_command

FAULTS = ("labels", "nan", "slow", "hang", "crash", "sdc", "none")
SERVE_READY_TIMEOUT_S = 60.0  # the aggregator imports DuckDB and FastAPI: allow a slow start
POLL_S = 1.0  # how often the demo looks at the job and the aggregator
SETTLE_S = 20.0  # after the job ends, time for the last records and for lost ranks to show
DEFAULT_NODE_TIMEOUT_S = 10  # MS_NODE_TIMEOUT: how soon msrun gives up on a dead rank
HOST = "127.0.0.1"
SUMMARY_FILE = "summary.json"  # machine-readable summary, beside the job logs
SUMMARY_SAID = "the same as JSON:"  # the line that names it
INSTALL_HINT = "pip install 'rankwatch[mindspore]'"

WHAT_TO_LOOK_FOR = {
    "labels": "rank {r}'s loss and grad_norm_local jump to ~2-3x the others from step {k}; "
    "it gets flagged as an outlier within a few steps, the other ranks never.",
    "nan": "rank {r}'s loss turns NaN at step {k}; the all-reduce spreads NaN to every rank one "
    "step later, and the dashboard shows which rank went first.",
    "slow": "rank {r}'s data loading stalls from step {k}: every rank's step_time rises alike "
    "(they wait for it in the all-reduce), but its data_time stands out and it gets flagged.",
    "hang": "rank {r} hangs at step {k}: its steps stop while its heartbeats go on (stalled); "
    "in the msrun job the others wait in the all-reduce until it times out (they crash), then "
    "msrun kills the hung rank (lost).",
    "crash": "rank {r} raises at step {k}: it shows crashed with its message; msrun kills the "
    "others, which show lost.",
    "sdc": "rank {r}'s gradients are 1.5x what they should be from step {k}, before the "
    "all-reduce (silent data corruption): the loss shows nothing, but its grad_norm_local sits "
    "above the others' and it gets flagged within a few steps.",
    "none": "no fault: the ranks stay together and nothing is flagged.",
}


@dataclass
class DemoConfig:
    fault: str = "labels"
    fault_rank: int = 2
    fault_step: int = 20
    ranks: int = 4
    steps: int = 300
    step_sleep: float = 0.2
    port: int = 8670
    ingest_port: int = 8671
    data: Path = Path("rankwatch_data") / "demo"
    simulate: bool = False
    serve_wait: bool = True
    exit_when_done: bool = False
    duration: float | None = None
    node_timeout_s: int = DEFAULT_NODE_TIMEOUT_S
    lost_after_s: float | None = None
    min_stall_s: float | None = None  # `serve --min-stall-s`: how soon the hang shows stalled
    policy: str | None = None  # `serve --policy`; the ranks then accept checkpoint and stop

    def check(self) -> None:
        """Raise ValueError with a clear message for impossible settings."""
        if self.fault not in FAULTS:
            raise ValueError(f"--fault must be one of {', '.join(FAULTS)}, got {self.fault!r}")
        if self.ranks < 1:
            raise ValueError(f"--ranks must be >= 1, got {self.ranks}")
        if self.fault != "none" and not 0 <= self.fault_rank < self.ranks:
            raise ValueError(f"--fault-rank {self.fault_rank} is not a rank of 0..{self.ranks - 1}")
        if self.steps < 1 or self.fault_step < 1:
            raise ValueError("--steps and --fault-step must be >= 1")
        if self.step_sleep < 0:
            raise ValueError("--step-sleep must be >= 0")
        if self.lost_after_s is not None and not self.lost_after_s > 0:
            raise ValueError("--lost-after must be > 0 seconds")
        if self.min_stall_s is not None and not 0 < self.min_stall_s < math.inf:
            raise ValueError("--min-stall must be > 0 seconds")
        for name, port in (("--port", self.port), ("--ingest-port", self.ingest_port)):
            if not 1 <= port <= 65535:
                raise ValueError(f"{name} {port} is not a TCP port")
        if self.port == self.ingest_port:
            raise ValueError("--port and --ingest-port must differ")
        if self.policy is not None:
            from rankwatch.aggregator.actions.policy import PolicyError, parse_spec

            try:
                parse_spec(self.policy)
            except PolicyError as exc:
                raise ValueError(str(exc)) from None


def mindspore_available() -> bool:
    return importlib.util.find_spec("mindspore") is not None


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def bin_dir() -> Path:
    """The directory of this interpreter's scripts (a venv's bin): msrun and workers need it."""
    return Path(sys.executable).parent


def rankwatch_command() -> list[str]:
    """How to run the `rankwatch` console script of this very environment."""
    script = bin_dir() / "rankwatch"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from rankwatch.cli.main import main; main()"]


def serve_command(cfg: DemoConfig, data: Path) -> list[str]:
    cmd = [*rankwatch_command(), "serve", "--data", str(data)]
    cmd += ["--host", HOST, "--port", str(cfg.port)]
    cmd += ["--ingest-host", HOST, "--ingest-port", str(cfg.ingest_port)]
    if cfg.lost_after_s is not None:
        config = data / "serve.toml"  # lost_after_s has no flag of its own
        config.write_text(f"[serve]\nlost_after_s = {float(cfg.lost_after_s)}\n", encoding="utf-8")
        cmd += ["--config", str(config)]
    if cfg.min_stall_s is not None:
        cmd += ["--min-stall-s", str(float(cfg.min_stall_s))]
    if cfg.policy is not None:
        cmd += ["--policy", cfg.policy]
    return cmd


def export_lines(run: str, http: str, data: Path) -> list[str]:
    """The banner's export commands for ``run``: through the demo's server while it runs (it
    holds the store's lock), from its store once stopped."""
    out = shlex.quote(f"{run}.csv")
    name = shlex.quote(run)
    return [
        f"  export:     rankwatch export --run {name} --url {http} --out {out}",
        f"              (once stopped: rankwatch export --run {name} "
        f"--data {shlex.quote(str(data))} --out {out})",
    ]


def job_options(cfg: DemoConfig) -> dict[str, object]:
    return {
        "steps": cfg.steps,
        "fault": cfg.fault,
        "fault_rank": cfg.fault_rank,
        "fault_step": cfg.fault_step,
        "step_sleep": cfg.step_sleep,
    }


def msrun_command(cfg: DemoConfig, log_dir: Path, master_port: int) -> list[str]:
    msrun = shutil.which("msrun", path=str(bin_dir())) or shutil.which("msrun") or "msrun"
    script = Path(__file__).with_name("train_mindspore.py")
    cmd = [msrun, f"--worker_num={cfg.ranks}", f"--local_worker_num={cfg.ranks}"]
    cmd += [f"--master_addr={HOST}", f"--master_port={master_port}"]
    cmd += [f"--log_dir={log_dir}", "--join=True", str(script)]
    for name, value in job_options(cfg).items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd


def actions_summary(commands: list[Any], steps: int, fault_step: int) -> dict[str, Any]:
    """What the policy did: the commands, each rank's answer, the steps a stop saved."""
    lines: list[str] = []
    stopped: set[Any] = set()  # the steps the ranks said they stopped after
    for c in sorted(
        commands, key=lambda c: (float(c.get("created") or 0), c.get("cmd") != "checkpoint")
    ):
        acks: dict[str, Any] = c.get("acks") or {}
        states = ", ".join(f"rank {r} {a.get('state')}" for r, a in sorted(acks.items()))
        who = f"{c.get('cmd')} at step {c.get('step')} by {c.get('by')}"
        lines.append(f"  action:     {who}: {states or 'recorded'}")
        if c.get("cmd") == "stop" and acks:
            stopped = {a.get("step") if a.get("state") == "done" else None for a in acks.values()}
    at = next(iter(stopped)) if len(stopped) == 1 else None
    saved = steps - at if isinstance(at, int) else 0
    if isinstance(at, int):
        lines.append(f"  saved:      every rank stopped after step {at}, {at - fault_step} after "
                     f"the fault: {saved} of {steps} steps not trained on a bad run")  # fmt: skip
    elif stopped:
        lines.append(
            f"  saved:      the ranks did not all stop at one step: {sorted(map(str, stopped))}"
        )
    else:
        lines.append("  saved:      nothing: the policy sent no stop (no matching incident)")
    return {"lines": lines, "stopped_at": at, "saved_steps": saved}


class _Stop(Exception):
    """Raised from the SIGTERM handler so that cleanup runs as for Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


class Demo:
    def __init__(self, cfg: DemoConfig) -> None:
        self.cfg = cfg
        self.procs = Processes()
        self.run = "demo-" + time.strftime("%Y%m%d-%H%M%S")
        self.data = cfg.data.resolve()
        self.http = f"http://{HOST}:{cfg.port}"
        self.serve: subprocess.Popen[bytes] | None = None
        self.job: subprocess.Popen[bytes] | SimulatedJob | None = None
        self.job_code: int | None = None
        self.reporter = status.Reporter(self.http, self.run, self.say)

    def say(self, text: str) -> None:
        print(text, flush=True)

    # --- start ---------------------------------------------------------------------------

    def start_serve(self) -> None:
        for name, port in (("--port", self.cfg.port), ("--ingest-port", self.cfg.ingest_port)):
            if not port_free(port):
                raise RuntimeError(f"port {port} on {HOST} is in use: pick another with {name}")
        self.data.mkdir(parents=True, exist_ok=True)
        log = self.data / "serve.log"
        self.serve = self.procs.spawn("serve", serve_command(self.cfg, self.data), log_path=log)
        if not self.cfg.serve_wait:
            return
        deadline = time.monotonic() + SERVE_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.serve.poll() is not None:
                tail = self.procs.tail(self.serve)
                raise RuntimeError(f"rankwatch serve exited with {self.serve.returncode}:\n{tail}")
            if status.get_json(self.http + "/api/status") is not None:
                return
            time.sleep(0.25)
        raise RuntimeError(
            f"rankwatch serve did not answer on {self.http} within "
            f"{SERVE_READY_TIMEOUT_S:g} s (see {log})"
        )

    def job_env(self) -> dict[str, str]:
        return {
            "RANKWATCH_RUN": self.run,
            "RANKWATCH_ADDR": f"{HOST}:{self.cfg.ingest_port}",
            "RANKWATCH_LOG_DIR": str(self.data / "logs"),
            "PATH": f"{bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
            "MS_NODE_TIMEOUT": str(self.cfg.node_timeout_s),
            "PYTHONUNBUFFERED": "1",
            **({"RANKWATCH_ACCEPT": "checkpoint,stop"} if self.cfg.policy else {}),
        }

    def start_job(self) -> None:
        job_dir = self.data / "jobs" / self.run
        if self.cfg.simulate:
            procs = [
                self.procs.spawn(
                    f"rank{rank}",
                    rank_command(rank, self.cfg.ranks, job_options(self.cfg)),
                    env=self.job_env(),
                    log_path=job_dir / f"rank{rank}.log",
                )
                for rank in range(self.cfg.ranks)
            ]
            self.job = SimulatedJob(procs)
            return
        cmd = msrun_command(self.cfg, job_dir, free_port())
        self.job = self.procs.spawn(
            "msrun", cmd, env=self.job_env(), log_path=job_dir / "msrun.log"
        )

    def job_poll(self) -> int | None:
        if self.job is None:
            return None
        return self.job.poll()

    # --- watch ---------------------------------------------------------------------------

    def banner(self) -> None:
        cfg = self.cfg
        kind = "simulated ranks" if cfg.simulate else "MindSpore msrun job"
        self.say(f"rankwatch demo: run {self.run}, {cfg.ranks} ranks ({kind}), {cfg.steps} steps")
        self.say(f"  dashboard:  {self.http}/#run={self.run}")
        self.say(f"  aggregator: tcp://{HOST}:{cfg.ingest_port}, data in {self.data}")
        self.say(f"  job logs:   {self.data / 'jobs' / self.run}")
        for line in export_lines(self.run, self.http, self.data):
            self.say(line)
        if cfg.fault != "none":
            self.say(
                f"  fault:      {cfg.fault} on rank {cfg.fault_rank} from step {cfg.fault_step}"
            )
        hint = WHAT_TO_LOOK_FOR[cfg.fault].format(r=cfg.fault_rank, k=cfg.fault_step)
        self.say(f"  look for:   {hint}")
        if cfg.policy:
            self.say(f"  policy:     {cfg.policy} (the ranks accept checkpoint and stop)")
        if not cfg.exit_when_done:
            self.say("Press Ctrl-C to stop everything.")

    def watch(self) -> None:
        """Report flags live until the job ends (or the hang shows, or the duration is up)."""
        reporter = self.reporter
        started = time.monotonic()
        while True:
            reporter.poll()
            self.job_code = self.job_poll()
            if self.job_code is not None:
                self.say(f"job ended (exit code {self.job_code}); collecting the last records")
                break
            if self.cfg.duration is not None and time.monotonic() - started > self.cfg.duration:
                self.say(f"--duration {self.cfg.duration:g} s is up")
                return
            if (
                self.cfg.exit_when_done
                and self.cfg.fault == "hang"
                and reporter.rank_state(self.cfg.fault_rank) == "stalled"
            ):
                self.say(f"rank {self.cfg.fault_rank} is stalled, as injected")
                return
            time.sleep(POLL_S)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and not reporter.all_settled(self.cfg.ranks):
            reporter.poll()
            time.sleep(POLL_S)
        reporter.poll()

    def summary(self) -> None:
        cfg = self.cfg
        self.reporter.poll()
        for line in self.reporter.summary_lines(cfg.fault, cfg.fault_rank, cfg.fault_step):
            self.say(line)
        data = self.reporter.summary(cfg.fault, cfg.fault_rank, cfg.fault_step)
        if cfg.policy:
            commands = status.get_json(f"{self.http}/api/run/commands?run={self.run}") or {}
            said = actions_summary(commands.get("commands") or [], cfg.steps, cfg.fault_step)
            for line in said["lines"]:
                self.say(line)
            data["actions"] = said
        path = self.data / "jobs" / self.run / SUMMARY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        self.say(f"  {SUMMARY_SAID} {path}")

    # --- run and stop --------------------------------------------------------------------

    def main(self) -> int:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            self.start_serve()
            self.start_job()
            self.banner()
            self.watch()
            self.summary()
            if not self.cfg.exit_when_done and self.cfg.duration is None:
                self.say(f"The dashboard stays up at {self.http} until you press Ctrl-C.")
                while True:
                    time.sleep(3600)
            return 0
        except (KeyboardInterrupt, _Stop):
            self.say("\nstopping...")
            return 0  # the user asked for it
        except (RuntimeError, OSError) as exc:  # a port in use, serve or msrun failing to start
            self.say(f"rankwatch demo: {exc}")
            return 2
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut cleanup
            try:
                self.stop()
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, previous)

    def stop(self) -> None:
        killed = self.procs.stop_all()
        note = f" (swept {len(killed)} leftover processes)" if killed else ""
        self.say(f"rankwatch demo: stopped everything it started{note}")


def run_demo(cfg: DemoConfig) -> int:
    """Run the demo; returns the process exit code."""
    try:
        cfg.check()
    except ValueError as exc:
        print(f"rankwatch demo: {exc}", file=sys.stderr)
        return 2
    if not cfg.simulate and not mindspore_available():
        print(
            "rankwatch demo: MindSpore is not installed, so the real msrun job cannot run.\n"
            f"  Install it with:  {INSTALL_HINT}\n"
            "  Or watch simulated ranks (same agent -> ZeroMQ -> aggregator path):\n"
            "    rankwatch demo --simulate",
            file=sys.stderr,
        )
        return 2
    return Demo(cfg).main()
