"""Which agents to ask for the records the aggregator is missing (seq gaps), and when.

Pure but for the ``request`` callable it is handed (the receiver's ``request_resend``). A gap
is asked for from the rank's newest incarnation (the connected one; an earlier one's gaps are
left to `rankwatch import` of its JSONL), again after ``RESEND_RETRY_S``, at most
``RESEND_MAX_TRIES`` times.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

from rankwatch.aggregator.health import RankHealth
from rankwatch.aggregator.seqs import SeqTracker

log = logging.getLogger("rankwatch.service")

RESEND_CHECK_S = 0.5  # how often seq gaps are looked for (a rank about to end has little time)
RESEND_RETRY_S = 10.0  # a gap is asked for again after this long ...
RESEND_MAX_TRIES = 3  # ... this many times, then left to `rankwatch import`

Request = Callable[[str, int, int, int], bool]  # (run, rank, from_seq, inc) -> sent


class Resender:
    def __init__(self) -> None:
        # (run, rank) -> (inc, first missing seq), tries, time of the last request
        self._asked: dict[tuple[str, int], tuple[tuple[int, int], int, float]] = {}
        self._next_check = 0.0

    def request(
        self,
        health: Mapping[str, Mapping[int, RankHealth]],
        now: float,
        seqs: SeqTracker,
        current_inc: Callable[[str, int], int],
        request: Request,
    ) -> int:
        """Ask for the oldest gap of every rank that has one and is due; returns how many
        requests were sent. Looks at most every ``RESEND_CHECK_S``."""
        if now < self._next_check:
            return 0
        self._next_check = now + RESEND_CHECK_S
        sent = 0
        # only the sequences with a gap: at 100,000 ranks, a sweep of every rank twice a second
        # would cost more than all the gaps
        due = sorted(
            (run, rank, inc)
            for run, rank, inc in seqs.gapped()
            if rank in health.get(run, ()) and inc == current_inc(run, rank)
        )
        keep = {(run, rank) for run, rank, _ in due}
        for key in [k for k in self._asked if k not in keep]:
            del self._asked[key]
        for run, rank, inc in due:
            gaps = seqs.gaps(run, rank, limit=1, inc=inc)
            key = (run, rank)
            if not gaps:
                self._asked.pop(key, None)
                continue
            lo = gaps[0][0]
            prev, tries, last = self._asked.get(key, ((0, 0), 0, -math.inf))
            same = prev == (inc, lo)
            if same and (tries >= RESEND_MAX_TRIES or now - last < RESEND_RETRY_S):
                continue
            if request(run, rank, lo, inc):
                self._asked[key] = ((inc, lo), tries + 1 if same else 1, now)
                sent += 1
                log.info(
                    "rankwatch: asked %s rank %d to resend from seq %d (%d gap(s))",
                    run, rank, lo, seqs.gap_count(run, rank, inc),
                )  # fmt: skip
        return sent
