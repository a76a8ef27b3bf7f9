"""The service's telemetry part: records in from the ingest path, hardware findings out once a
tick, the live stream's telemetry messages at a low rate, and the card notes incidents carry.
Pure: ``now`` is passed in.

Incident evidence is added from outside the tracker (``annotate``): an incident whose culprit's
card stands out gets a sentence about it in its summary and one timeline entry per card, made
when the incident opens (or changes culprits) and kept with it, so a resolved incident still
says what the card was doing when it went wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from rankwatch.aggregator.incidents.model import Evidence, IncidentChange
from rankwatch.aggregator.telemetry.cards import card_note, rank_rows
from rankwatch.aggregator.telemetry.outliers import (
    Finding,
    HardwareConfig,
    HardwareWatch,
    TelemetryLike,
)

Notes = tuple[tuple[int | None, str], ...]  # (the culprit, or None for its node; the words)

FEED_EVERY_S = 5.0  # telemetry on the live stream at most this often per run
NOTE_CULPRITS = 3  # culprits whose cards an incident describes
NOTES_MAX = 4096  # incident notes kept (the oldest dropped first)


class TelemetryIntake:
    def __init__(self, config: HardwareConfig | None = None) -> None:
        self.watch = HardwareWatch(config)
        self.findings: list[Finding] = []
        self._pending: list[TelemetryLike] = []
        self._changed: dict[str, set[int]] = {}
        self._sent: dict[str, float] = {}
        self._notes: dict[str, Notes] = {}  # incident id -> its card notes

    def take(self, rec: TelemetryLike) -> None:
        self._pending.append(rec)
        self._changed.setdefault(rec.run, set()).add(rec.rank)

    def tick(self) -> list[Finding]:
        """Every hardware condition that holds now (the alert engine's ``hardware``)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self.watch.add(pending)
        self.findings = self.watch.evaluate()
        return self.findings

    def feed_messages(self, now: float) -> list[dict[str, Any]]:
        """``{"type": "telemetry", "run", "ranks": {rank: row}}`` for the runs whose cards
        sent samples since their last message, at most every ``FEED_EVERY_S``; a row holds
        the rank table's hardware columns, host, card and flags (the charts re-read the
        series: a message of every value of thousands of cards would dwarf the rest)."""
        out = []
        for run in list(self._changed):
            if now - self._sent.get(run, -FEED_EVERY_S) < FEED_EVERY_S:
                continue
            ranks = self._changed.pop(run)
            self._sent[run] = now
            rows = rank_rows(self.watch, run)
            body = {str(rank): rows[rank] for rank in sorted(ranks) if rank in rows}
            out.append({"type": "telemetry", "run": run, "time": now, "ranks": body})
        return out

    def rows(self, run: str) -> dict[int, dict[str, Any]]:
        return rank_rows(self.watch, run)

    # --- incident evidence -------------------------------------------------------------------

    def annotate(self, change: IncidentChange) -> IncidentChange:
        """``change`` with its culprits' card notes in the summary and the timeline."""
        inc = change.incident
        notes = self._notes.get(inc.id)
        if notes is None or change.change == "updated":
            notes = self._make_notes(inc.run, inc.culprits)
            if notes or inc.id in self._notes:
                self._remember(inc.id, notes)
        if not notes:
            return change
        timeline = tuple(
            Evidence(None, self.watch.card(inc.run, rank).time, rank, note)
            for rank, note in notes
            if rank is not None
        )
        words = "; ".join(note for _, note in notes)
        incident = dataclasses.replace(
            inc, summary=f"{inc.summary}; {words}", timeline=inc.timeline + timeline
        )
        return dataclasses.replace(change, incident=incident)

    def annotate_dict(self, body: dict[str, Any]) -> dict[str, Any]:
        """An incident's dict form with the notes it was given (``annotate``)."""
        notes = self._notes.get(str(body.get("id")))
        if not notes:
            return body
        words = "; ".join(note for _, note in notes)
        run = str(body.get("run", ""))
        timeline = [
            Evidence(None, self.watch.card(run, rank).time, rank, note).as_dict()
            for rank, note in notes
            if rank is not None
        ]
        return {**body, "summary": f"{body.get('summary', '')}; {words}",
                "timeline": [*body.get("timeline", []), *timeline]}  # fmt: skip

    def _make_notes(self, run: str, culprits: Iterable[int]) -> Notes:
        notes: list[tuple[int | None, str]] = []
        nodes = {f.host: f for f in self.findings if f.run == run and f.rule == "hw_node"}
        told: set[str] = set()
        for rank in list(culprits)[:NOTE_CULPRITS]:
            host = self.watch.card(run, rank).host
            node = nodes.get(host)
            if node is not None:
                if host not in told:
                    told.add(host)
                    notes.append((None, node.message))
                continue
            note = card_note(self.watch, run, rank)
            if note is not None:
                notes.append((rank, note))
        return tuple(notes)

    def _remember(self, incident_id: str, notes: Notes) -> None:
        self._notes[incident_id] = notes
        while len(self._notes) > NOTES_MAX:
            del self._notes[next(iter(self._notes))]

    def forget(self, run: str) -> None:
        self.watch.forget(run)
        self._changed.pop(run, None)
        self._sent.pop(run, None)
        for key in [k for k in self._notes if k.startswith(f"{run}#")]:
            del self._notes[key]
