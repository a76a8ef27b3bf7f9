"""The import rules that keep the tree's picture true, checked over the source with ``ast``.

The head node (aggregator), the per-node relay and the dashboard share only the wire with the
agent; the relay runs on compute nodes with the agent's dependencies only; the agent knows
nothing of the parts that receive what it sends.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"agent": "rankwatch.agent", "aggregator": "rankwatch.aggregator",
           "relay": "rankwatch.relay", "dashboard": "rankwatch.dashboard"}  # fmt: skip
WIRE = "rankwatch.agent.wire"

# (folder, a package it must not import, what under that package it may import anyway, why)
RULES = [
    ("aggregator", "rankwatch.agent", WIRE, "the head node reads the agent's wire only"),
    ("relay", "rankwatch.agent", WIRE, "the relay reads the agent's wire only"),
    ("dashboard", "rankwatch.agent", WIRE, "the dashboard reads the agent's wire only"),
    ("agent/wire", "rankwatch.agent", WIRE, "the wire stands alone, so the rules above hold"),
    ("relay", "rankwatch.aggregator", None, "the relay runs without the server packages"),
    ("relay", "rankwatch.dashboard", None, "the relay runs without the server packages"),
    ("agent", "rankwatch.aggregator", None, "the agent knows nothing of the head node"),
    ("agent", "rankwatch.dashboard", None, "the agent knows nothing of the head node"),
    ("agent", "rankwatch.relay", None, "the agent knows nothing of the relay"),
    # Next: the dashboard imports only the read interface of the aggregator, e.g.
    # ("dashboard", "rankwatch.aggregator", "rankwatch.aggregator.<read interface>", "..."),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is one of our modules or packages (a file in the tree)."""
    for folder, package in FOLDERS.items():
        if within(name, package):
            path = ROOT / folder / name[len(package) + 1 :].replace(".", "/")
            return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    return False


def imported(path: Path, name: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, lazy ones included; for
    ``from m import n`` that is ``m.n`` when ``n`` is a submodule, else ``m``."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield node.lineno, full if is_module(full) else base
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(folder: str, banned: str, allowed: str | None) -> list[str]:
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imported(path):
            if within(module, banned) and not (allowed and within(module, allowed)):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return sorted(set(out))


@pytest.mark.parametrize(("folder", "banned", "allowed", "why"), RULES, ids=lambda v: str(v))
def test_import_rule(folder: str, banned: str, allowed: str | None, why: str) -> None:
    assert violations(folder, banned, allowed) == [], why


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    assert module_name(ROOT / "agent/wire/records.py") == "rankwatch.agent.wire.records"
    assert module_name(ROOT / "relay/__init__.py") == "rankwatch.relay"
    found = {m for _, m in imported(ROOT / "agent/wire/records.py")}
    assert "rankwatch.agent.wire.jsonsafe" in found  # relative: from .jsonsafe import ...
    monitor = {m for _, m in imported(ROOT / "agent/monitor.py")}
    assert {"rankwatch.agent.hooks", "rankwatch.agent.wire.records", "json"} <= monitor
    bad = tmp_path / "bad.py"
    bad.write_text("import rankwatch.agent\nfrom rankwatch.agent import Monitor\n")
    assert [m for _, m in imported(bad, "rankwatch.aggregator.bad")] == [
        "rankwatch.agent",
        "rankwatch.agent",
    ]
    # what a violation looks like: the rules above would report each of these
    assert violations("agent", "rankwatch.agent.sender", None)  # monitor.py imports the sender
    assert violations("agent", "rankwatch.agent", WIRE)


def test_importing_the_wire_does_not_load_the_monitor() -> None:
    """The head node and the relay import the wire; the agent's Monitor stays unloaded."""
    import subprocess
    import sys

    code = (
        "import sys, rankwatch.agent.wire.records, rankwatch.agent.wire.curve, "
        "rankwatch.agent.wire.addresses; "
        "print(sorted(m for m in sys.modules if m.startswith('rankwatch.agent.') "
        "and not m.startswith('rankwatch.agent.wire')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
