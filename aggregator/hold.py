"""A new incident's first announcement waits for its evidence to settle.

When the culprit's evidence arrives after its peers' (its NaN step scored after their next one,
its stack sample after theirs), the pass that opens the incident names the wrong rank and an
``updated`` message follows: the first message a person reads is the wrong one. So ``opened``
is told once ``quiet_s`` went by without its culprits or cause changing, and at the latest
``max_s`` after it opened; an ``updated`` meanwhile is folded into it (one message, the latest
judgement). Later changes go out at once; a held incident that resolves is told opened, then
resolved. Only the announcements (console, webhooks) wait: the store, the live stream and the
API have every change at once.

Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankwatch.aggregator.incidents import IncidentChange

__all__ = ["AnnounceHold"]


@dataclass
class _Held:
    change: IncidentChange  # "opened", with the latest judgement
    opened: float  # now when the tracker opened it
    changed: float  # now at its latest culprit or cause change


class AnnounceHold:
    def __init__(self, quiet_s: float, max_s: float) -> None:
        for name, value in (("quiet_s", quiet_s), ("max_s", max_s)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self.quiet_s, self.max_s = quiet_s, max_s
        self._held: dict[str, _Held] = {}  # incident id -> held opening, oldest first
        self.folded = 0  # updates told as part of the first announcement instead

    def __len__(self) -> int:
        return len(self._held)

    def due(self, now: float, changes: Sequence[IncidentChange]) -> list[IncidentChange]:
        """This pass's changes in, the changes to announce now out."""
        out: list[IncidentChange] = []
        held = self._held
        for change in changes:
            key = change.incident.id
            waiting = held.get(key)
            if change.change == "opened" and (self.quiet_s or self.max_s):
                held[key] = _Held(change, now, now)
            elif waiting is None:
                out.append(change)
            elif change.change == "updated":
                waiting.change = IncidentChange("opened", change.incident)
                waiting.changed = now
                self.folded += 1
            else:  # resolved before it was told
                out += (held.pop(key).change, change)
        for key, waiting in list(held.items()):
            if now - waiting.changed >= self.quiet_s or now - waiting.opened >= self.max_s:
                out.append(held.pop(key).change)
        return out

    def flush(self) -> list[IncidentChange]:
        """Everything held, to tell now (the service is stopping)."""
        out = [waiting.change for waiting in self._held.values()]
        self._held.clear()
        return out
