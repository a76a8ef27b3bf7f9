"""Bad input from the agents, counted per sender and reason and logged once.

Each problem counts in its sender's ``SenderStats.bad``, in ``reasons`` (by reason, for
``/metrics``) and in the receiver's totals (``bad_records`` or ``bad_messages``). It is logged
once per (sender, reason, detail), up to ``MAX_LOGGED`` such keys: past that the log says once
that it goes quiet and the rest is only counted, so a peer inventing problems costs counts, not
memory or log lines. A newer schema version is its own line, once per sender and version,
whatever that sender got wrong before: it is the one problem an operator fixes on the head node.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
from rankwatch.agent.wire import records
from rankwatch.agent.wire.records import DecodeError
from rankwatch.aggregator.ingest.peers import SenderStats

MAX_LOGGED = 10_000  # (sender, reason, detail) keys already logged, to log each once


class Problems:
    """The counts and the log-once keys of one receiver's bad input."""

    def __init__(self, totals: dict[str, int], log: logging.Logger) -> None:
        self._totals = totals
        self._log = log
        self.reasons: dict[str, int] = {}
        self._logged: set[tuple[str, str, str]] = set()  # (sender, reason, detail)

    def bad(
        self,
        stats: SenderStats,
        reason: str,
        message: str,
        record: bool = False,
        *,
        detail: str = "",
        level: int = logging.WARNING,
        count: int = 1,
    ) -> None:
        """Count ``count`` of a problem; log it once per (sender, reason, detail)."""
        stats.bad[reason] = stats.bad.get(reason, 0) + count
        self.reasons[reason] = self.reasons.get(reason, 0) + count
        self._totals["bad_records" if record else "bad_messages"] += count
        key = (stats.label, reason, detail)
        logged = self._logged
        if key in logged:
            return
        if len(logged) >= MAX_LOGGED:
            if len(logged) == MAX_LOGGED:  # say once that the log goes quiet, and why
                logged.add(("", "", "full"))
                self._log.warning(
                    "%d distinct (sender, problem) pairs logged; further bad input is only "
                    "counted (rankwatch_aggregator_ingest_errors on /metrics)",
                    MAX_LOGGED,
                )
            return
        logged.add(key)
        if detail.startswith("newer"):
            self._log.log(level, "agent %s: %s", stats.label, message)
            return
        what = "record" if record else "message"
        self._log.log(
            level,
            "dropped a bad %s from agent %s (%s): %s; further %r problems from this "
            "sender are only counted",
            what,
            stats.label,
            reason,
            message[:300],
            reason,
        )

    def bad_version(self, stats: SenderStats, frame: bytes, exc: DecodeError) -> None:
        """A frame refused for its schema version: when it is newer than this aggregator's,
        the log line says how to fix it (upgrade the head node)."""
        version = _frame_version(frame)
        if version is None or version <= records.SCHEMA_VERSION:
            self.bad(stats, "version", str(exc))
            return
        self.bad(
            stats,
            "version",
            f"it sends wire schema version {version}, newer than this aggregator's "
            f"{records.SCHEMA_VERSION}: upgrade rankwatch on the head node (`pip install -U "
            "rankwatch`, then restart `rankwatch serve`); until then its records are dropped "
            "and counted",
            detail=f"newer {version}",
            level=logging.ERROR,
        )


def whose(raw: dict[str, Any]) -> str:
    """Which run and rank a bad record says it is from, for the log line."""
    run, rank = raw.get("run"), raw.get("rank")
    if isinstance(run, str) and type(rank) is int:
        return f" (a record of run {run[:60]!r}, rank {rank})"
    return ""


def _frame_version(frame: bytes) -> int | None:
    """The ``v`` of a frame that decoded as far as its version check (so it is a msgpack map)."""
    try:
        envelope = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=0)
    except Exception:  # msgpack raises several unrelated types
        return None
    version = envelope.get("v") if isinstance(envelope, dict) else None
    return version if type(version) is int else None
