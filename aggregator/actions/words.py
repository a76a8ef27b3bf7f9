"""Commands in words, for `rankwatch status` and the console: one line per command."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

MAX_LINES = 10  # commands listed per run, newest first
MAX_RANKS_NAMED = 8  # ranks named per answer state; beyond, a count


def command_line(c: Mapping[str, Any]) -> str:
    """``COMMAND stop at step 14 by policy:nonfinite 23:01:02: 4 done`` and who did not."""
    when = time.strftime("%H:%M:%S", time.localtime(float(c.get("created") or 0.0)))
    at = f" at step {c['step']}" if c.get("step") is not None else ""
    acks: Mapping[str, Mapping[str, Any]] = c.get("acks") or {}
    by_state: dict[str, list[str]] = {}
    for rank, answer in acks.items():
        by_state.setdefault(str(answer.get("state")), []).append(rank)
    parts = []
    for state, ranks in sorted(by_state.items(), key=lambda kv: (kv[0] != "done", kv[0])):
        if state == "done" or len(ranks) > MAX_RANKS_NAMED:
            parts.append(f"{len(ranks)} {state}")
        else:
            parts.append(f"{state} rank {','.join(sorted(ranks, key=int))}")
    answers = "; ".join(parts) if parts else "recorded"
    head = f"COMMAND {c.get('cmd')}{at} by {c.get('by') or '?'} {when}: {answers}"
    refused = [a.get("detail") for a in acks.values() if a.get("state") in ("refused", "failed")]
    return head + (f" ({str(refused[0])[:120]})" if refused and refused[0] else "")


def command_lines(commands: Iterable[Mapping[str, Any]]) -> list[str]:
    items = sorted(commands, key=lambda c: float(c.get("created") or 0.0), reverse=True)
    lines = [command_line(c) for c in items[:MAX_LINES]]
    if len(items) > MAX_LINES:
        lines.append(f"... and {len(items) - MAX_LINES} earlier commands (GET /api/run/commands)")
    return lines
