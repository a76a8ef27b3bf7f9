"""Which agents to ask for the records the aggregator is missing (seq gaps), and when.

Pure but for the ``request`` callable it is handed (the receiver's ``request_resend``). A gap
is asked for from the rank's newest incarnation (the connected one; an earlier one's gaps are
left to `rankwatch import` of its JSONL), again after ``RESEND_RETRY_S``, at most
``RESEND_MAX_TRIES`` times.

The work of a check follows what changed, not every gap: a rank is looked at when its first
gap opened or moved (``SeqTracker.take_moved``), when its health state changed (``wake``: a
rank heard from again, or for the first time since a restart, can be asked now) or when its
next request falls due (a schedule kept in time order). A gap given up, or a rank that cannot
be reached, costs nothing until then: 100,000 ranks may each hold a gap no agent can fill (the
ranks are gone, or their agents' buffers were), and a sweep of them all twice a second kept an
idle head node busy.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Mapping

from rankwatch.aggregator.health import RankHealth
from rankwatch.aggregator.seqs import SeqTracker

log = logging.getLogger("rankwatch.service")

RESEND_CHECK_S = 0.5  # how often seq gaps are looked for (a rank about to end has little time)
RESEND_RETRY_S = 10.0  # a gap is asked for again after this long ...
RESEND_MAX_TRIES = 3  # ... this many times, then left to `rankwatch import`
UNREACHED_MAX_S = 60.0  # a rank with no route is tried again ever later, at most this late

Request = Callable[[str, int, int, int], bool]  # (run, rank, from_seq, inc) -> sent
Key = tuple[str, int]  # (run, rank)


class Resender:
    def __init__(self) -> None:
        # (run, rank) -> (inc, first missing seq) asked for, tries, time of the last request
        self._asked: dict[Key, tuple[tuple[int, int], int, float]] = {}
        self._due: list[tuple[float, str, int]] = []  # (when, run, rank): a heap
        self._woken: set[Key] = set()
        self._unreached: dict[Key, float] = {}  # (run, rank) -> its wait before the next try
        self._next_check = 0.0

    def wake(self, ranks: Iterable[Key]) -> None:
        """Ranks whose health state changed: looked at in the next check."""
        self._woken.update(ranks)

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
        due = self._due
        ready = {(run, rank) for run, rank, _ in seqs.take_moved()}
        ready |= self._woken
        self._woken = set()
        while due and due[0][0] <= now:
            _, run, rank = heapq.heappop(due)
            ready.add((run, rank))
        sent = 0
        for run, rank in sorted(ready):  # in rank order: the log reads as the gaps do
            inc = current_inc(run, rank)
            lo = seqs.first_gap(run, rank, inc)
            key = (run, rank)
            if lo is None or rank not in health.get(run, ()):
                # filled; or not heard from since a restart, or its run is over here: woken
                # when it is heard from
                self._asked.pop(key, None)
                self._unreached.pop(key, None)
                continue
            prev, tries, last = self._asked.get(key, ((0, 0), 0, float("-inf")))
            same = prev == (inc, lo)
            if same and tries >= RESEND_MAX_TRIES:
                continue  # given up: looked at again when its first gap moves
            if same and now - last < RESEND_RETRY_S:
                heapq.heappush(due, (last + RESEND_RETRY_S, run, rank))
                continue
            if request(run, rank, lo, inc):
                self._unreached.pop(key, None)
                tries = tries + 1 if same else 1
                self._asked[key] = ((inc, lo), tries, now)
                sent += 1
                log.info(
                    "rankwatch: asked %s rank %d to resend from seq %d (%d gap(s))",
                    run, rank, lo, seqs.gap_count(run, rank, inc),
                )  # fmt: skip
                if tries < RESEND_MAX_TRIES:
                    heapq.heappush(due, (now + RESEND_RETRY_S, run, rank))
            else:  # no route to it (yet): tried again ever later, and when it is heard from
                wait = min(UNREACHED_MAX_S, 2 * self._unreached.get(key, RESEND_CHECK_S / 2))
                self._unreached[key] = wait
                heapq.heappush(due, (now + wait, run, rank))
        return sent

    def pending(self) -> int:
        """Requests scheduled (a rank may be in it more than once): for tests and figures."""
        return len(self._due)
