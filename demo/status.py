"""What the demo reads back from the aggregator's HTTP API, and what it tells the user.

``Reporter`` polls ``/api/status`` (``Aggregator.snapshot()``) and ``/api/alerts`` and remembers
every flag it saw: a divergence can resolve between two polls, and the summary at the end must
still name it. An open incident is said once (again when its culprit or cause changes), and the
flags of the ranks it names as affected are kept for the summary but not said one by one: a NaN
that spreads is one line about the rank that started it, not a line per rank and metric. Plain
``urllib``: the demo adds no client dependency.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from rankwatch.aggregator.health.rules import OVER_STATES

HTTP_TIMEOUT_S = 3.0
TELLING_STATES = ("crashed", "lost", "stalled", "paused")  # states whose message is worth showing


def get_json(url: str, timeout_s: float = HTTP_TIMEOUT_S) -> Any | None:
    """The decoded JSON body, or None when the server is not (yet) answering with 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            if response.status != 200:
                return None
            return json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


@dataclass(frozen=True)
class Flag:
    """The first sighting of one (rank, kind, metric) the aggregator flagged."""

    rank: int
    kind: str  # a divergence kind (outlier, nonfinite, straggler) or an alert rule
    metric: str | None
    since_step: int | None
    step: int | None  # the step at which it was reported (for alerts: None)
    message: str


class Reporter:
    """Polls the aggregator for one run and reports what changed through ``say``."""

    def __init__(self, http: str, run: str, say: Callable[[str], None]) -> None:
        self.http = http.rstrip("/")
        self.run = run
        self.say = say
        self.entry: dict[str, Any] = {}
        self.flags: dict[tuple[int, str], Flag] = {}
        self.states: dict[int, str] = {}
        self.messages: dict[int, str] = {}
        self.lines: dict[int, str] = {}  # the messages in one line
        self.last_step: int | None = None
        self.incidents: dict[str, tuple[str, tuple[int, ...]]] = {}  # id -> (cause, culprits) said
        self.affected: set[int] = set()  # ranks an incident says the fault reached
        self.quiet = 0  # their flags, not said one by one
        self.words: dict[str, str] = {}  # incident id -> its latest sentence

    def poll(self) -> None:
        query = urllib.parse.urlencode({"run": self.run})
        incidents = get_json(f"{self.http}/api/runs/{urllib.parse.quote(self.run, safe='')}"
                             "/incidents")  # fmt: skip
        self.ingest(
            get_json(f"{self.http}/api/status?{query}"),  # not the earlier demos' runs
            get_json(f"{self.http}/api/alerts?{query}"),
            incidents,
        )

    def ingest(self, snapshot: Any, alerts: Any, incidents: Any = None) -> None:
        """Take in one ``/api/status``, ``/api/alerts`` and ``/api/runs/R/incidents`` answer
        (None: not answered). Incidents first: their affected ranks' flags are not said."""
        if isinstance(incidents, Mapping) and isinstance(incidents.get("incidents"), list):
            self._incidents(list(reversed(incidents["incidents"])))  # oldest first
        if isinstance(snapshot, Mapping):
            for entry in snapshot.get("runs") or []:
                if isinstance(entry, Mapping) and entry.get("run") == self.run:
                    self.entry = dict(entry)
                    self._ranks(entry.get("ranks") or [])
                    self._incidents(entry.get("incidents") or [])
                    for div in entry.get("divergences") or []:
                        self._flag(div, div.get("kind") if isinstance(div, Mapping) else None)
                    if isinstance(entry.get("last_step"), int):
                        self.last_step = entry["last_step"]
        if isinstance(alerts, Mapping):
            for alert in [*(alerts.get("firing") or []), *(alerts.get("history") or [])]:
                if isinstance(alert, Mapping) and alert.get("run") == self.run:
                    self._flag(alert, alert.get("rule"))

    def _ranks(self, ranks: list[Any]) -> None:
        for row in ranks:
            if not isinstance(row, Mapping) or type(row.get("rank")) is not int:
                continue
            rank, state = row["rank"], str(row.get("state"))
            if self.states.get(rank) == state:
                continue
            first_sight = rank not in self.states
            self.states[rank] = state
            message = str(row.get("message") or "") if state in TELLING_STATES else ""
            if message:
                self.messages[rank] = message
                # the server's one line (exception type and what failed); cut here without one
                self.lines[rank] = str(row.get("message_line") or _first_line(message))
            if first_sight and state == "alive":
                continue  # a rank joining is not news; leaving the healthy state is
            step = row.get("last_step")
            at = f" at step {step}" if step is not None else ""
            suffix = f": {self.lines[rank]}" if message else ""
            self.say(f"  rank {rank}: {state}{at}{suffix}")

    def _incidents(self, incidents: list[Any]) -> None:
        for inc in incidents:
            if not isinstance(inc, Mapping) or not isinstance(inc.get("id"), str):
                continue
            culprits = tuple(r for r in inc.get("culprits") or [] if type(r) is int)
            self.words[inc["id"]] = f"{inc.get('cause')}: {inc.get('summary') or ''}"
            self.affected.update(r for r in inc.get("affected") or [] if type(r) is int)
            self.affected.difference_update(culprits)
            said = (str(inc.get("cause")), culprits)
            if self.incidents.get(inc["id"]) == said:
                continue
            word = "INCIDENT" if inc["id"] not in self.incidents else "INCIDENT UPDATED"
            self.incidents[inc["id"]] = said
            self.say(f"  {word} {said[0]}: {inc.get('summary') or ''}")

    def _flag(self, item: Any, kind: Any) -> None:
        """Remember the first sighting per (rank, metric), or per (rank, rule) for health."""
        if not isinstance(item, Mapping) or type(item.get("rank")) is not int:
            return  # run-wide alerts carry no rank
        metric = item.get("metric") if isinstance(item.get("metric"), str) else None
        key = (item["rank"], metric or str(kind))
        since, step = item.get("since_step"), item.get("step")
        flag = Flag(
            rank=item["rank"],
            kind=str(kind),
            metric=metric,
            since_step=since if type(since) is int else None,
            step=step if type(step) is int else None,
            message=str(item.get("message") or ""),
        )
        known = self.flags.get(key)
        if known is None:
            self.flags[key] = flag
            if flag.rank in self.affected:
                self.quiet += 1
            else:
                self.say(f"  FLAG rank {flag.rank}: {_describe(flag)}")
        elif known.step is None and flag.step is not None:
            self.flags[key] = replace(known, step=flag.step)  # an alert came before its divergence

    def rank_state(self, rank: int) -> str | None:
        return self.states.get(rank)

    def all_settled(self, ranks: int) -> bool:
        """Every rank finished, crashed or lost (so the summary is final)."""
        if len(self.states) < ranks:
            return False
        return all(state in OVER_STATES for state in self.states.values())

    def flagged_ranks(self) -> list[int]:
        return sorted({flag.rank for flag in self.flags.values()})

    def first_flag_step(self, rank: int) -> int | None:
        """The earliest step at which ``rank`` was reported (else the earliest since_step)."""
        flags = [f for f in self.flags.values() if f.rank == rank]
        steps = [f.step if f.step is not None else f.since_step for f in flags]
        known = [s for s in steps if s is not None]
        return min(known) if known else None

    def summary(self, fault: str, fault_rank: int, fault_step: int) -> dict[str, Any]:
        """Machine-readable summary (written as JSON next to the job logs)."""
        flagged = self.flagged_ranks()
        return {
            "run": self.run,
            "state": self.entry.get("state"),
            "last_step": self.last_step,
            "ranks": {str(rank): state for rank, state in sorted(self.states.items())},
            "messages": {str(r): m for r, m in sorted(self.messages.items()) if m},
            "fault": fault,
            "fault_rank": fault_rank if fault != "none" else None,
            "fault_step": fault_step if fault != "none" else None,
            "flagged": flagged,
            "first_flag_step": {str(r): self.first_flag_step(r) for r in flagged},
            "flags": [asdict(flag) for flag in self.flags.values()],
        }

    def summary_lines(self, fault: str, fault_rank: int, fault_step: int) -> list[str]:
        data = self.summary(fault, fault_rank, fault_step)
        lines = [f"summary of run {self.run} (state {data['state']}, last step {self.last_step}):"]
        states = ", ".join(f"{r} {s}" for r, s in data["ranks"].items())
        lines.append(f"  ranks: {states or 'none seen'}")
        for rank, message in data["messages"].items():
            lines.append(f"  rank {rank}: {self.lines.get(int(rank)) or _first_line(message)}")
        for words in self.words.values():
            lines.append(f"  incident {words}")
        if not data["flagged"]:
            lines.append("  flagged: no rank")
        quiet = sorted({f.rank for f in self.flags.values() if f.rank in self.affected})
        for flag in sorted(self.flags.values(), key=lambda f: (f.rank, f.since_step or 0)):
            if flag.rank not in self.affected:
                lines.append(f"  flagged rank {flag.rank}: {_describe(flag)}")
        if quiet:
            count = sum(f.rank in self.affected for f in self.flags.values())
            lines.append(
                f"  flagged too, as the fault reached them: ranks {quiet} ({count} flags; "
                "the incident names the rank it started on)"
            )
        if fault != "none":
            first = self.first_flag_step(fault_rank)
            if first is None:
                verdict = f"rank {fault_rank} was not flagged"
            else:
                verdict = f"rank {fault_rank} flagged at step {first}"
            state = self.states.get(fault_rank)
            if state in TELLING_STATES:
                verdict += f", and it is {state}"
            others = [r for r in data["flagged"] if r != fault_rank]
            later = [self.first_flag_step(r) for r in others]
            after = [s for s in later if s is not None and first is not None and s > first]
            tail = f"; also flagged: ranks {others}" if others else "; no other rank flagged"
            if others and len(after) == len(others):  # every other rank flagged after it
                tail = f"; it went first, ranks {others} followed from step {min(after)}"
            elif others and all(self.states.get(r) in TELLING_STATES for r in others):
                states = ", ".join(f"rank {r} {self.states[r]}" for r in others)
                tail = f"; the other ranks: {states}"
            lines.append(
                f"  injected {fault} on rank {fault_rank} at step {fault_step}: {verdict}{tail}"
            )
        return lines


def _describe(flag: Flag) -> str:
    metric = f"{flag.metric} " if flag.metric else ""
    since = f" since step {flag.since_step}" if flag.since_step is not None else ""
    at = f", reported at step {flag.step}" if flag.step is not None else ""
    message = f": {_first_line(flag.message)}" if flag.message else ""
    return f"{metric}{flag.kind}{since}{at}{message}"


def _first_line(text: Any) -> str:
    """The gist of a message: its first two informative lines, without MindSpore's banners."""
    keep = []
    for line in str(text).splitlines():
        line = line.strip()
        if not line.strip("-= ") or (line.startswith("- ") and line.endswith(":")):
            continue  # "-----" rulers and "- Kernel error:" headings
        keep.append(line)
        if len(keep) == 2 or not line.endswith(":"):
            break
    return " ".join(keep)[:200]
