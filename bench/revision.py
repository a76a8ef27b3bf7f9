"""Another revision's code beside this tree's, for the benches that time both in one run."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def module_at(rev: str, path: str) -> types.ModuleType:
    """The module at ``path`` as revision ``rev`` has it (``git show``), imported on its own:
    what it imports comes from this tree. Raises ``subprocess.CalledProcessError`` for an
    unknown revision or path."""
    source = git("show", f"{rev}:{path}")
    name = f"{Path(path).stem}_at_" + "".join(c if c.isalnum() else "_" for c in rev)
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module
