"""What a person reads from the console script, bad input first: each message in full words."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import StepRecord
from rankwatch.aggregator.alerts.console import readable
from rankwatch.aggregator.service import IMPORT_LIVE_WINDOW_S
from rankwatch.cli import completion
from rankwatch.cli.main import build_parser, subcommands

from tests.cli.running import RANKWATCH, Server, cli, wait_until


def python_m(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankwatch.cli", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def jsonl(path: Path, run: str, steps: range, t0: float, **metrics: float) -> Path:
    base = {"run": run, "rank": 0, "world_size": 1, "host": "h", "pid": 1, "epoch": None}
    recs = [
        StepRecord(**base, seq=s, time=t0 + s, step=s, metrics={"loss": 1.0 / s, **metrics})
        for s in steps
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(records.to_json_line(r) for r in recs))
    return path


def test_a_url_that_is_not_one_is_one_clear_line() -> None:
    result = cli("status", "--url", "notaurl")
    assert result.returncode == 2
    assert result.stderr == (
        "rankwatch status: --url 'notaurl' is not an http:// or https:// URL "
        "(like http://notaurl)\n"
    )
    scheme_less = cli("import", "x.jsonl", "--url", "127.0.0.1:8670")
    assert scheme_less.returncode == 2
    assert "(like http://127.0.0.1:8670)" in scheme_less.stderr
    assert "Traceback" not in scheme_less.stderr


def test_an_unknown_flag_is_named_and_a_missing_command_is_listed() -> None:
    bogus = python_m("--bogus")
    assert bogus.returncode == 2
    assert bogus.stderr.splitlines()[-1] == (
        "rankwatch: error: unknown option --bogus (see rankwatch --help)"
    )
    assert "COMMAND" not in bogus.stderr.splitlines()[-1]
    in_command = cli("status", "--bogus", "--url", "http://127.0.0.1:1")
    assert in_command.returncode == 2
    assert in_command.stderr.splitlines()[-1] == (
        "rankwatch status: error: unknown option --bogus (see rankwatch status --help)"
    )
    nothing = cli()
    assert nothing.returncode == 2
    assert nothing.stderr.splitlines()[-1] == (
        "rankwatch: error: a COMMAND is missing, one of: serve, status, stacks, policy, import, "
        "export, demo, relay, keys, completion"
    )


def test_a_bad_public_url_says_what_is_wrong_and_what_one_looks_like(tmp_path: Path) -> None:
    bad = cli("serve", "--data", str(tmp_path / "data"), "--port", "0", "--ingest-port", "0",
              "--public-url", "rankwatch.example.org")  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "rankwatch serve: --public-url 'rankwatch.example.org' is not the dashboard's address: it "
        "must start with http:// or https:// and name a host (like https://rankwatch.example.org/ "
        "or http://head-node:8670)"
    )
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_help_is_plain_words() -> None:
    for name in subcommands(build_parser()):
        text = cli(name, "--help").stdout
        assert "`" not in text, f"{name} --help:\n{text}"
    imported = cli("import", "--help").stdout
    assert "With --url the records go to a running rankwatch serve (POST /api/ingest)" in " ".join(
        imported.split()
    )


def test_a_file_with_a_bad_line_says_what_was_read_stored_and_rejected(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "logs" / "rank0.jsonl", "job", range(1, 4), time.time())
    good = path.read_text().splitlines(keepends=True)
    path.write_text(good[0] + "{oops\n" + "".join(good[1:]) + '{"v": 1}\n')
    result = cli("import", str(path), "--data", str(tmp_path / "data"))
    assert result.returncode == 1
    first, second, total = result.stdout.splitlines()
    assert first.startswith(
        f"{path}: 5 lines read, 3 records stored, 0 already stored, 2 rejected "
        "(first at line 2: not a JSON line"
    )
    assert second.startswith("  line 5: ")
    assert "empty" not in result.stdout
    assert total == "imported 3 new records from 1 file(s), 0 duplicates"
    (tmp_path / "none.jsonl").write_text("")
    empty = cli("import", str(tmp_path / "none.jsonl"), "--data", str(tmp_path / "data"))
    assert f"{tmp_path / 'none.jsonl'}: empty file, nothing to import" in empty.stdout


def test_busy_ports_are_named_before_anything_is_created(
    servers: Callable[..., Server], tmp_path: Path
) -> None:
    server = servers(tmp_path / "a")
    port = int(server.url.rsplit(":", 1)[1])
    fresh = tmp_path / "b"
    both = cli("serve", "--data", str(fresh), "--port", str(port),
               "--ingest-host", "127.0.0.1", "--ingest-port", str(server.ingest_port))  # fmt: skip
    assert both.returncode == 2
    assert both.stderr == (
        f"rankwatch serve: dashboard http://127.0.0.1:{port} is in use (another rankwatch "
        "serve?): pick another --port; agents' address "
        f"tcp://127.0.0.1:{server.ingest_port} is in use (another rankwatch serve?): pick "
        "another --ingest-port\n"
    )
    ingest = cli("serve", "--data", str(fresh), "--port", "0",
                 "--ingest-port", str(server.ingest_port))  # fmt: skip
    assert ingest.returncode == 2
    assert ingest.stderr == (
        f"rankwatch serve: agents' address tcp://*:{server.ingest_port} is in use (another "
        "rankwatch serve?): pick another --ingest-port\n"
    )
    assert not fresh.exists()


def test_a_served_store_a_missing_run_and_readable_numbers(
    servers: Callable[..., Server], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = servers(data)
    now = time.time()
    # Well inside the window in which an import updates the live state (which status reads):
    # at its edge, a slow start of the first import left that run out of the snapshot.
    assert IMPORT_LIVE_WINDOW_S > 400
    for i, run in enumerate(("oldest", "older", "newer", "newest", "latest", "last")):
        path = jsonl(tmp_path / run / "rank0.jsonl", run, range(1, 3), now - 300 + 30 * i,
                     throughput=13750.0, step_time=0.25)  # fmt: skip
        assert cli("import", str(path), "--url", server.url).returncode == 0

    locked = cli("import", str(path), "--data", str(data))
    assert locked.returncode == 2
    assert locked.stderr.count("--url") == 1, locked.stderr
    assert locked.stderr.startswith("rankwatch import: ")

    missing = cli("status", "--url", server.url, "--run", "nope")
    assert missing.returncode == 1
    assert missing.stderr == (
        "rankwatch status: no run named 'nope'; the server knows (newest first): last, latest, "
        "newest, newer, older (and 1 more)\n"
    )

    wait_until(lambda: server.status("--run", "last")["runs"])
    table = cli("status", "--url", server.url, "--run", "last").stdout
    assert "throughput (samples/s)" in table and "step_time (s)" in table
    assert "13,750" in table and "e+04" not in table


@pytest.mark.parametrize(
    ("value", "shown"),
    [(13750.0, "13,750"), (1.375e4 + 0.4, "13,750"), (0.123456, "0.1235"), (123.456, "123.5"),
     (1e-05, "1e-05"), (2.5e16, "2.5e+16"), (0.0, "0"), (-4321.0, "-4,321")],
)  # fmt: skip
def test_readable_numbers(value: float, shown: str) -> None:
    assert readable(value) == shown


def test_bash_completion_from_the_parsers(tmp_path: Path) -> None:
    script = tmp_path / "rankwatch.bash"
    made = cli("completion", "bash")
    assert made.returncode == 0
    script.write_text(made.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(f'"{w}"' for w in words)
        probe = (
            f"source {script}\n"
            f"COMP_WORDS=(rankwatch {line}); COMP_CWORD={len(words)}\n"
            '_rankwatch; printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        out = subprocess.run(
            ["bash", "--norc", "--noprofile", "-c", probe], capture_output=True, text=True,
            timeout=30, check=True, cwd=tmp_path,
        ).stdout  # fmt: skip
        return [w for w in out.splitlines() if w]

    registered = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", f"source {script}; complete -p rankwatch"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert registered.stdout.strip() == "complete -F _rankwatch rankwatch"
    assert complete("st") == ["status", "stacks"]
    assert complete("") == [*subcommands(build_parser()), "-h", "--help", "--version", "-v",
                            "--verbose"]  # fmt: skip
    assert complete("demo", "--fault", "") == [
        "labels", "nan", "slow", "hang", "crash", "sdc", "none"
    ]  # fmt: skip
    assert complete("status", "--j") == ["--json"]
    assert complete("completion", "") == ["bash", "zsh"]
    assert complete("serve", "--port", "") == []
    (tmp_path / "run.jsonl").write_text("")
    assert complete("import", "ru") == ["run.jsonl"]
    assert complete("export", "--format", "p") == ["parquet"]


def test_zsh_completion_is_the_bash_one_through_bashcompinit() -> None:
    zsh = cli("completion", "zsh").stdout
    assert zsh.startswith("#compdef rankwatch\n")
    assert "bashcompinit" in zsh and "complete -F _rankwatch rankwatch" in zsh
    assert zsh.endswith(completion.bash_script(build_parser()).split("\n", 1)[1])
    if shutil.which("zsh"):  # where zsh is installed: the script registers with compsys
        probe = f'eval "$({RANKWATCH} completion zsh)"; print -r -- "${{_comps[rankwatch]}}"'
        check = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True)
        assert check.stdout.strip() == "_bash_complete -F _rankwatch", check.stderr
    bad = cli("completion", "fish")
    assert bad.returncode == 2 and "invalid choice: 'fish'" in bad.stderr


def test_the_console_script_is_the_module() -> None:
    assert os.access(RANKWATCH, os.X_OK)
    assert python_m("--version").stdout == cli("--version").stdout == "rankwatch 0.1.0\n"
