"""The table of docs/reliability.md: every fault injected, bad input tried and access check,
with its result and the records lost, from one command.

    python bench/reliability.py [--fuzz-frames 1000000] [--no-fuzz] [-k PYTEST_EXPR]

Runs ``pytest tests/hardening`` (each test injects its fault into real processes and reports
its figures through the ``report`` fixture) and then ``bench/fuzz_ingest.py`` at the chosen
size, and prints one Markdown table. Tests that cannot run here (no root for tmpfs or network
namespaces) show as skipped, with the reason. Exit status 0 only when everything passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORT_ENV = "RANKWATCH_RELIABILITY_OUT"  # tests/hardening/conftest.py writes one line per test


def run_tests(out: Path, junit: Path, expr: str | None) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "pytest", "tests/hardening", "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}"]  # fmt: skip
    if expr:
        cmd += ["-k", expr]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, REPORT_ENV: str(out)})
    return done.returncode, time.monotonic() - started


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test name -> (passed | failed | skipped, message)."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = "skipped" if tag == "skipped" else "failed"
                lines = (node.get("message") or "").splitlines()
                message = lines[0][:160] if lines else ""
        result[case.get("name", "?")] = (status, message)
    return result


def lost(entry: dict[str, Any]) -> str:
    if "missing" in entry:
        return str(entry["missing"])
    valid = entry.get("valid_run") or entry.get("valid_ranks")
    if isinstance(valid, dict):
        return str(valid.get("missing"))
    if "stored_steps" in entry:
        return str(entry["steps"] - entry["stored_steps"])
    return "–"


def figures(entry: dict[str, Any]) -> str:
    skip = {"kind", "what", "result", "test", "missing", "extra", "differ"}
    parts = []
    for key, value in sorted(entry.items()):
        if key not in skip:
            parts.append(f"{key}={value}")
    return "; ".join(parts)


def fuzz(frames: int) -> dict[str, Any] | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fuzz.json"
        cmd = [sys.executable, "bench/fuzz_ingest.py", "--frames", str(frames), "--json", str(out)]
        subprocess.run(cmd, cwd=ROOT)
        return json.loads(out.read_text()) if out.exists() else None


def fuzz_row(big: dict[str, Any]) -> str:
    idle, busy = big["status_ms_idle"], big["status_ms_fuzz"]
    result = "up; every rejection counted by reason; all valid data stored" if big["ok"] else "FAIL"
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(big["reasons"].items()))
    numbers = (
        f"sent in {big['sent_s']} s, all counted after {big['processed_s']} s, all stored after "
        f"{big['stored_s']} s; send rate median {big['rate_median']:,.0f}/s; rejected: {reasons}; "
        f"{big['fuzz_records_stored']:,} valid fuzz records stored; /api/status ms median/p95 "
        f"{idle[0]}/{idle[1]} before, {busy[0]}/{busy[1]} under fuzz; internal errors "
        f"{int(big['counters']['internal_errors'])}, store errors "
        f"{int(big['counters']['store_errors'])}"
    )
    what = (
        f"{big['messages']:,} random and mutated messages + {big['oversized']} oversized "
        "frames at a real serve while real ranks publish"
    )
    lost_count = big["valid_ranks"]["missing"]
    return f"| input | {what} | {result} | {lost_count} | {numbers} | bench/fuzz_ingest.py |"


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fuzz-frames", type=int, default=1_000_000)
    parser.add_argument("--no-fuzz", action="store_true", help="only the hardening tests")
    parser.add_argument("-k", dest="expr", help="pytest -k expression for the tests")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out, junit = Path(tmp) / "reliability.jsonl", Path(tmp) / "junit.xml"
        code, seconds = run_tests(out, junit, args.expr)
        lines = out.read_text().splitlines() if out.exists() else []
        entries = [json.loads(line) for line in lines]
        status = outcomes(junit) if junit.exists() else {}
    big = None if args.no_fuzz else fuzz(args.fuzz_frames) or {"ok": False, "crashed": True}
    rows = ["| kind | fault or input | result | records lost | figures | test |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    reported = set()
    for entry in entries:
        name = entry["test"]
        reported.add(name)
        state = status.get(name, ("?", ""))[0]
        rows.append(
            f"| {entry['kind']} | {cell(entry['what'])} | {cell(entry['result'])} | "
            f"{lost(entry)} | {cell(figures(entry))} | {name} ({state}) |"
        )
    for name, (state, message) in sorted(status.items()):
        if name not in reported:
            rows.append(f"| check | {cell(name)} | {cell(message) or state} | – | – | "
                        f"{name} ({state}) |")  # fmt: skip
    if big is not None and big.get("crashed"):
        rows.append("| input | bench/fuzz_ingest.py | FAIL: see its output above | ? | – | – |")
    elif big is not None:
        rows.append(fuzz_row(big))
    print("\n".join(rows))
    failed = [n for n, (s, _) in status.items() if s == "failed"]
    bench = "skipped" if big is None else ("PASS" if big["ok"] else "FAIL")
    print(f"\nhardening tests: exit {code} in {seconds:.0f} s; failed: {failed or 'none'}; "
          f"fuzz bench: {bench}")  # fmt: skip
    return 0 if code == 0 and (big is None or big["ok"]) else 1


if __name__ == "__main__":
    sys.exit(main())
