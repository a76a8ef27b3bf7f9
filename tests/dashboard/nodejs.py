"""The page's own ES modules run by node (no browser): for the pure parts of its scripts."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

STATIC_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "static"
NODE = shutil.which("node")

needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


def run_module(tmp_path: Path, files: Sequence[str], imports: str, body: str) -> Any:
    """``imports`` (an import line of ``files``) then the JSON of ``body``, a JS expression."""
    for name in files:
        shutil.copy(STATIC_DIR / name, tmp_path / name)
    (tmp_path / "package.json").write_text('{"type": "module"}')  # the page's files are modules
    script = tmp_path / "main.js"
    script.write_text(f"{imports}\nconsole.log(JSON.stringify({body}));\n")
    assert NODE is not None
    done = subprocess.run([NODE, str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
