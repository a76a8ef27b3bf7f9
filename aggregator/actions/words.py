"""Commands in words: one line per command for `rankwatch status` and the console, and what an
incident's messages say was done about it (or how a person can act on it)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

MAX_LINES = 10  # commands listed per run, newest first
MAX_RANKS_NAMED = 8  # ranks named per answer state; beyond, a count
MAX_GROUPS_TOLD = 3  # actions an incident message names, newest last
ANSWERED = ("received", "late", "done", "failed", "refused", "aborted")  # a rank acknowledged


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


# --- what an incident's messages say about actions ----------------------------------------------


def incident_action(
    commands: Sequence[Mapping[str, Any]], run: str, firing: bool, public_url: str | None = None
) -> dict[str, Any] | None:
    """The ``action`` of an incident message: the commands sent about it in one line
    (``taken``), or, while it fires and nothing was sent, how to act on it (``offered``: the
    dashboard, whose incident card has the buttons, and the HTTP request). None when resolved
    and nothing was done."""
    sent = [c for c in commands if c.get("cmd") != "notify" and c.get("ranks")]
    http = command_request(run, public_url)
    if sent:
        groups = _groups(sent)[-MAX_GROUPS_TOLD:]
        return {
            "taken": True, "line": "; ".join(_group_line(g) for g in groups), "how": "",
            "commands": [_brief(c) for g in groups for c in g], "dashboard": public_url,
            "http": http,
        }  # fmt: skip
    if not firing:
        return None
    notified = sorted({str(c.get("by")) for c in commands if c.get("cmd") == "notify"})
    told = f" ({', '.join(notified)}: notify)" if notified else ""
    line = f"no action taken{told}: checkpoint or stop it with the buttons on the dashboard's " \
        "incident card (serve --token)"  # fmt: skip
    return {"taken": False, "line": line, "how": f"or: {http}", "commands": [],
            "dashboard": public_url, "http": http}  # fmt: skip


def command_request(run: str, public_url: str | None, cmd: str = "stop") -> str:
    """The HTTP request that sends ``cmd`` to every live rank of ``run`` (where the dashboard's
    address is not known, its path)."""
    path = f"/api/run/commands?run={quote(run, safe='')}"
    if not public_url:
        return f'POST {path} with {{"cmd": "{cmd}"}} and the serve token to the dashboard'
    return (f"curl -X POST -H 'Authorization: Bearer $TOKEN' -d '{{\"cmd\": \"{cmd}\"}}' "
            f"'{public_url.rstrip('/')}{path}'")  # fmt: skip


def _groups(commands: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Commands of one decision (the same step, sender and ranks: checkpoint, then stop)."""
    out: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for c in sorted(commands, key=lambda c: (float(c.get("created") or 0.0), str(c.get("id")))):
        key = (c.get("step"), c.get("by"), tuple(c.get("ranks") or ()))
        out.setdefault(key, []).append(c)
    return list(out.values())


def _group_line(group: Sequence[Mapping[str, Any]]) -> str:
    """``action: checkpoint then stop at step 23 sent to 4 ranks (policy nonfinite); 4/4
    acknowledged, done``."""
    head = group[0]
    kinds = " then ".join(str(c.get("cmd")) for c in group)
    at = f" at step {head['step']}" if head.get("step") is not None else ""
    ranks = [str(r) for r in head.get("ranks") or ()]
    acks = [c.get("acks") or {} for c in group]
    reached = any(int(a.get("sends") or 0) > 0 for ack in acks for a in ack.values())
    verb = "sent to" if reached else "not yet delivered to"
    who = str(head.get("by") or "?").replace("policy:", "policy ", 1)
    n = len(ranks)
    answered = sum(1 for r in ranks if all((ack.get(r) or {}).get("state") in ANSWERED
                                           for ack in acks))  # fmt: skip
    line = f"action: {kinds}{at} {verb} {n} rank{'s' if n != 1 else ''} ({who}); {answered}/{n} "
    line += "acknowledged"
    states = [str(c.get("state")) for c in group]
    if all(s == "done" for s in states):
        return line + ", done"
    if any(s == "aborted" for s in states):
        return line + ", aborted for every rank (" + _why(group) + ")"
    if all(s != "waiting" for s in states):
        return line + ", incomplete (" + _why(group) + ")"
    return line


def _why(group: Sequence[Mapping[str, Any]]) -> str:
    """The ranks that kept the commands from being done, by command and answer."""
    parts = []
    for c in group:
        by_state: dict[str, list[str]] = {}
        for rank, a in (c.get("acks") or {}).items():
            if a.get("state") not in ("done", "received", "late", "aborted"):
                by_state.setdefault(str(a.get("state")), []).append(str(rank))
        for state, named in sorted(by_state.items()):
            ranks = sorted(named, key=int)
            few = len(ranks) <= MAX_RANKS_NAMED
            what = f"{state} rank {','.join(ranks)}" if few else f"{len(ranks)} {state}"
            parts.append(f"{c.get('cmd')}: {what}" if len(group) > 1 else what)
    return "; ".join(parts) or "see the commands"


def _brief(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": c.get("id"), "cmd": c.get("cmd"), "step": c.get("step"), "by": c.get("by"),
            "ranks": len(c.get("ranks") or ()), "state": c.get("state"),
            "counts": dict(c.get("counts") or {})}  # fmt: skip
