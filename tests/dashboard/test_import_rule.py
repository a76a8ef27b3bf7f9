"""The dashboard reads the aggregator through its read interface only: from
``rankwatch.aggregator`` it imports ``rankwatch.aggregator.provider`` and nothing else (the value
types it needs are re-exported there). Checked over the source with ``ast``, so a route that
reaches into the store or the alert engine fails here, not in a review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rankwatch.dashboard

DASHBOARD = Path(rankwatch.dashboard.__file__).resolve().parent
ALLOWED = {"rankwatch.aggregator.provider"}


def _aggregator_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if node.module in ALLOWED:
                names = [node.module]
        else:
            continue
        for name in names:
            if name == "rankwatch.aggregator" or name.startswith("rankwatch.aggregator."):
                found.append((node.lineno, name))
    return found


def test_the_dashboard_imports_only_the_provider_from_the_aggregator() -> None:
    sources = sorted(DASHBOARD.rglob("*.py"))
    assert len(sources) >= 8  # the package was found, not an empty folder
    broken = [
        f"{path.relative_to(DASHBOARD)}:{line}: imports {name}"
        for path in sources
        for line, name in _aggregator_imports(path)
        if name not in ALLOWED
    ]
    assert not broken, "the dashboard must read the aggregator through provider.py:\n" + "\n".join(
        broken
    )
    used = {name for path in sources for _, name in _aggregator_imports(path)}
    assert used == ALLOWED


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import rankwatch.aggregator.service\n"
        "from rankwatch.aggregator.store.db import Store\n"
        "from rankwatch.aggregator import feed\n"
        "from rankwatch.aggregator.provider import DataProvider\n"
    )
    names = [name for _, name in _aggregator_imports(bad)]
    assert [n for n in names if n not in ALLOWED] == [
        "rankwatch.aggregator.service",
        "rankwatch.aggregator.store.db",
        "rankwatch.aggregator.store.db.Store",
        "rankwatch.aggregator",
        "rankwatch.aggregator.feed",
    ]


def test_the_chart_sections_share_one_definition_of_what_their_charts_ask() -> None:
    """The training charts (app.js) and the hardware charts (hardware.js) answer the charts'
    ``highlighted()`` and ``extent()`` with chartset.js, not each with a copy of its own."""
    static = DASHBOARD / "static"
    for name in ("app.js", "hardware.js"):
        source = (static / name).read_text()
        assert "from './chartset.js'" in source, name
        copies = re.findall(r"^\s*(?:highlighted|extent)\(\)\s*\{", source, re.MULTILINE)
        assert not copies, f"{name} defines its own {copies}"
        assert "stepExtent()" not in source.replace("this.stepExtent()", ""), name
