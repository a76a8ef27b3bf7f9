"""Which judgements of open incidents the store has not seen yet.

Only a change of culprit or cause is announced, but an incident grows after it opens: the
ranks that fail after the culprit join it as affected or terminated. The store keeps each
incident's latest judgement so that a later `serve` shows it whole (with those ranks and where
they ran), so an incident that grew is stored again, quietly (no message, no stream). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from rankwatch.aggregator.incidents.model import Incident

KEPT_MAX = 65_536  # open incidents remembered; past it the oldest is forgotten (stored again)

__all__ = ["StoreDue"]


class StoreDue:
    def __init__(self) -> None:
        self._kept: dict[str, tuple[str, int]] = {}  # id -> what the store holds of it

    def stored(self, inc: Incident) -> None:
        """``inc`` went to the store (an announced change)."""
        if inc.state == "resolved":
            self._kept.pop(inc.id, None)
        else:
            self._remember(inc)

    def due(self, incidents: Iterable[Incident]) -> list[Incident]:
        """The open ones among ``incidents`` that changed since the store last got them."""
        out = []
        for inc in incidents:
            if inc.state == "firing" and self._kept.get(inc.id) != _seen(inc):
                out.append(inc)
                self._remember(inc)
        return out

    def _remember(self, inc: Incident) -> None:
        self._kept.pop(inc.id, None)  # re-inserted last: the dict's order is the age
        self._kept[inc.id] = _seen(inc)
        if len(self._kept) > KEPT_MAX:
            del self._kept[next(iter(self._kept))]


def _seen(inc: Incident) -> tuple[str, int]:
    # the sentence counts the affected and terminated ranks; the ranks' number says the rest
    return inc.summary, len(inc.ranks)
