"""deploy/: the launch wrappers (run for real, with `env` standing in for the launcher) and the
shape of the service files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
WRAPPERS = {"msrun-rankwatch": "MSRUN", "torchrun-rankwatch": "TORCHRUN"}


def run_wrapper(
    name: str, args: list[str], env_extra: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Run a wrapper whose launcher is a tiny script printing its env and its arguments."""
    env = {"PATH": "/usr/bin:/bin", **(env_extra or {})}
    env[WRAPPERS[name]] = str(DEPLOY.parent / "tests" / "e2e" / "_print_launch.sh")
    done = subprocess.run(
        [str(DEPLOY / name), *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    env_part, _, args_part = done.stdout.partition("--args--\n")
    seen_env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    return seen_env, args_part.splitlines()


@pytest.fixture(autouse=True)
def _need_sh() -> None:
    if shutil.which("sh") is None:
        pytest.skip("no POSIX sh")


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_wrapper_names_the_run_and_passes_every_argument(name: str) -> None:
    args = ["--nproc-per-node=2", "dir/train.py", "--lr", "0.1", "two words", ""]
    env, seen_args = run_wrapper(name, args)
    assert seen_args == args
    assert re.fullmatch(r"train-\d{8}-\d{6}-[0-9a-f]{6}", env["RANKWATCH_RUN"]), env
    assert "RANKWATCH_ADDR" not in env
    again, _ = run_wrapper(name, args)
    assert again["RANKWATCH_RUN"] != env["RANKWATCH_RUN"], "each launch gets its own run"


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_wrapper_options_and_environment(name: str) -> None:
    env, args = run_wrapper(
        name, ["--rankwatch-addr", "head:9000", "--rankwatch-run=my-run", "t.py"]
    )
    assert env["RANKWATCH_ADDR"] == "head:9000" and env["RANKWATCH_RUN"] == "my-run"
    assert args == ["t.py"]
    env, _ = run_wrapper(name, ["t.py"], {"RANKWATCH_RUN": "kept", "RANKWATCH_ADDR": "h"})
    assert env["RANKWATCH_RUN"] == "kept" and env["RANKWATCH_ADDR"] == "h"
    env, _ = run_wrapper(name, ["-m", "pkg.train"], {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"})
    assert env["RANKWATCH_RUN"] == "train-77.3", "a batch job id names the run on every node"


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_wrapper_without_a_command_explains_itself(name: str) -> None:
    done = subprocess.run([str(DEPLOY / name)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage:" in done.stderr


def test_service_files_agree_on_ports_and_command() -> None:
    unit = (DEPLOY / "systemd" / "rankwatch.service").read_text()
    container = (DEPLOY / "container" / "Containerfile").read_text()
    kube = (DEPLOY / "kubernetes" / "rankwatch.yaml").read_text()
    for text in (unit, container):
        assert "serve" in text and "--port" in text and "8670" in text and "8671" in text
    assert "containerPort: 8670" in kube and "containerPort: 8671" in kube
    assert "kind: PersistentVolumeClaim" in kube and "type: Recreate" in kube
    assert "pip install" in container and "[server]" in container
