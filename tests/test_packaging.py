"""The wheel as a user installs it: built from the tracked files, installed in a fresh venv.

The fresh venv borrows this environment's dependencies through a ``.pth`` file (nothing is
downloaded) but not rankwatch itself, so its `rankwatch serve` serves the page and assets from the
installed package or not at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests import polling

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {
    "rankwatch": "rankwatch",
    "rankwatch.agent": "agent",
    "rankwatch.aggregator": "aggregator",
    "rankwatch.relay": "relay",
    "rankwatch.dashboard": "dashboard",
    "rankwatch.cli": "cli",
    "rankwatch.demo": "demo",
}
BUILD_TIMEOUT_S = 180
START_TIMEOUT_S = 60.0
# Setuptools' own warnings are classes (SetuptoolsDeprecationWarning, _Warning); its lowercase
# "warning: byte-compiling is disabled" only echoes PYTHONDONTWRITEBYTECODE.
WARNING = re.compile(r"\w*Warning\b")


def _source_files() -> list[str]:
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout  # fmt: skip
        return [p for p in listed.decode().split("\0") if p and (ROOT / p).is_file()]
    skip = {".venv", ".git", "node_modules", "build", "test-artifacts", "rankwatch_data"}
    return [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the source tree (the checkout is left untouched)."""
    setuptools = version("setuptools")
    assert int(setuptools.split(".")[0]) >= 77, (
        f"setuptools {setuptools} cannot read the SPDX license: run bash deploy/dev-setup.sh"
    )
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for name in _source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = base / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    log = build.stdout + build.stderr
    assert build.returncode == 0, log[-4000:]
    warnings = [line.strip() for line in log.splitlines() if WARNING.search(line)]
    assert warnings == [], "the build warns:\n" + "\n".join(warnings)
    (found,) = out.glob("rankwatch-*.whl")
    return found


def test_the_wheel_holds_every_subpackage_and_every_static_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = []
    for package, folder in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "node_modules" not in init.parts:
                rel = init.relative_to(ROOT / folder).parent.parts
                expected.append("/".join([*package.split("."), *rel, "__init__.py"]))
    static = ROOT / "dashboard" / "static"
    tracked = set(_source_files())
    for path in static.rglob("*"):
        if path.is_file() and str(path.relative_to(ROOT)) in tracked:
            expected.append("rankwatch/dashboard/static/" + str(path.relative_to(static)))
    assert len(expected) > 20
    missing = sorted(set(expected) - names)
    assert missing == []
    assert "rankwatch-0.1.0.dist-info/entry_points.txt" in names


def _fresh_venv(base: Path, wheel: Path) -> Path:
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # Directories named in a .pth are appended after the venv's own site-packages, and the .pth
    # files inside them (this environment's editable rankwatch) are not run.
    ours = {sysconfig.get_paths()["purelib"], *(p for p in sys.path if p.endswith("-packages"))}
    (Path(purelib) / "borrowed_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    return venv


def test_the_installed_wheel_serves_the_page_and_its_assets(wheel: Path, tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, wheel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import rankwatch.dashboard.app as a; print(a.STATIC_DIR)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), where
    proc = subprocess.Popen(
        [str(venv / "bin" / "rankwatch"), "serve", "--data", str(tmp_path / "data"),
         "--port", "0", "--ingest-host", "127.0.0.1", "--ingest-port", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner, deadline = "", time.monotonic() + START_TIMEOUT_S
        while "mon.log" not in banner and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            banner += line
        found = re.search(r"http://[\d.]+:\d+", banner)
        assert found, banner
        url = found.group(0)
        static = ROOT / "dashboard" / "static"
        polling.wait_until(lambda: _get(url + "/") is not None, 20, 0.1, "the page")
        for path, source in (
            ("/", static / "index.html"),
            ("/static/app.js", static / "app.js"),
            ("/static/vendor/echarts.min.js", static / "vendor" / "echarts.min.js"),
        ):
            body = _get(url + path)
            if path == "/":
                assert b'<script defer src="/static/vendor/echarts.min.js">' in body
            else:
                assert body == source.read_bytes(), path
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read() if response.status == 200 else None
    except OSError:  # the banner comes as uvicorn starts to listen
        return None
