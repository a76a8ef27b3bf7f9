"""Which alert transitions an incident stands for: those the sinks that announce incidents
(webhooks) do not send one by one.

A rank-level alert (divergence, non-finite, straggler, stalled, lost, crashed) whose every rank
is part of an open incident of its run is covered: the incident's messages say it once, with
the culprit. Its resolution is covered too (it was never announced); an alert announced before
any incident covered it has its resolution sent as well. Run-level alerts (threshold, plateau,
throughput drop) and rank alerts no incident explains are never covered. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.incidents.model import Incident

RANK_RULES = frozenset({"divergence", "nonfinite", "straggler", "stalled", "lost", "crashed"})
HELD_MAX = 65_536  # covered alerts remembered while they fire; past it the oldest is forgotten

__all__ = ["RANK_RULES", "AlertCover"]


class AlertCover:
    def __init__(self) -> None:
        self._held: dict[str, None] = {}  # keys of covered alerts still firing, oldest first
        self.covered = 0  # transitions held back from the sinks that announce incidents
        self.forgotten = 0  # covered alerts forgotten past HELD_MAX (their resolution is sent)

    def judge(
        self, alerts: Sequence[Alert], incidents_of: Iterable[tuple[str, Sequence[Incident]]]
    ) -> list[bool]:
        """Per alert, in order: True when an incident stands for it. ``incidents_of``: (run,
        its incidents) for the runs of ``alerts``, as the tracker judges them after them."""
        ranks: dict[str, set[int]] = {}
        for run, incidents in incidents_of:
            held = ranks.setdefault(run, set())
            for inc in incidents:
                if inc.state == "firing":
                    held.update(inc.ranks)
        out = []
        for a in alerts:
            if a.state == "resolved":
                hit = a.key in self._held
                self._held.pop(a.key, None)
            else:
                named = a.ranks or ((a.rank,) if a.rank is not None else ())
                open_ranks = ranks.get(a.run, set())
                hit = a.rule in RANK_RULES and bool(named) and all(r in open_ranks for r in named)
                if hit:
                    self._hold(a.key)
            self.covered += hit
            out.append(hit)
        return out

    def _hold(self, key: str) -> None:
        self._held[key] = None
        if len(self._held) > HELD_MAX:
            del self._held[next(iter(self._held))]
            self.forgotten += 1
