"""How far the aggregator's own receiving is behind the clock.

Rank health judges silence ("no record for 10 s", "step has not advanced for 30 s") against the
time up to which every frame that reached the ingest socket has been taken in (``heard``), not
against the clock: while the ingest thread is behind (a backlog, a lock held, a starved or
stopped process), the frames it has not read may hold every rank's heartbeats, and calling the
ranks silent would open an incident for a fault of the head node.

The receiver says up to when it has handed out every frame that reached its socket
(``Receiver.heard_until``: the oldest waiting frame's stamp, the time the socket was last seen
empty before that frame was read; with nothing waiting, when it was last seen empty); once
those records are taken in, ``heard`` moves there. Under a steady backlog it trails by the
backlog's delay. After the loop itself did not run for a while (the process was stopped or
starved, or waited for the lock: a pass ends more than ``gap_s`` later than its wait and its own
work, the thread's CPU time, explain) ZeroMQ may still be reading what the network held
meanwhile, and the senders sending what they queued, so an empty socket seen within the gap's
length (``settle_s`` at least, ``SETTLE_MAX_S`` at most) after that pass proves nothing. A long
tick is work, not a gap: ZeroMQ's own thread reads on meanwhile. Each time it falls
``report_after_s`` behind is one episode, told once when it has caught up again, with the most
it fell behind.

Pure: times are passed in.
"""

from __future__ import annotations

import math

GAP_S = 1.0  # a pass this much later than its wait allows: the loop itself did not run
# After such a gap, for what the network and the senders held meanwhile to come in: as long as
# the gap (they queued that long; the senders drain at their own pace), at least SETTLE_S, at
# most SETTLE_MAX_S (past that, agents have reconnected and sent afresh).
SETTLE_S = 1.0
SETTLE_MAX_S = 30.0
REPORT_AFTER_S = 1.0  # this far behind is an episode (told once, counted)

__all__ = ["ReceiveProgress"]


class ReceiveProgress:
    def __init__(
        self,
        now: float,
        *,
        gap_s: float = GAP_S,
        settle_s: float = SETTLE_S,
        report_after_s: float = REPORT_AFTER_S,
    ) -> None:
        for name, value in (("gap_s", gap_s), ("settle_s", settle_s),
                            ("report_after_s", report_after_s)):  # fmt: skip
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self.gap_s, self.settle_s, self.report_after_s = gap_s, settle_s, report_after_s
        self.heard = now  # every frame that reached the socket before this time is taken in
        self._last = now  # when the previous pass ended
        self._settle_until = now
        self._worst = 0.0  # the most behind in the episode under way (0: none)
        self.episodes = 0  # times it fell report_after_s behind (each told once)
        self.worst_s = 0.0  # the most it ever fell behind

    def passed(self, end: float, wait_s: float, busy_s: float = 0.0) -> None:
        """One pass of the ingest loop ended at ``end``, having waited up to ``wait_s`` for
        traffic; ``busy_s``: the loop's CPU time since the previous pass ended (its tick, this
        pass's work)."""
        gap = end - self._last - wait_s - busy_s
        if gap > self.gap_s:
            settle = min(max(self.settle_s, gap), SETTLE_MAX_S)
            self._settle_until = max(self._settle_until, end + settle)
        self._last = end

    def read(self, until: float) -> None:
        """Every frame that reached the socket before ``until`` has been taken in."""
        if until >= self._settle_until:
            self.heard = max(self.heard, until)

    def behind(self, now: float) -> float:
        return max(0.0, now - self.heard)

    def caught_up(self, now: float) -> float | None:
        """Once per episode, when it is over: the most seconds it fell behind; else None."""
        behind = self.behind(now)
        self.worst_s = max(self.worst_s, behind)
        if behind >= self.report_after_s:
            if not self._worst:
                self.episodes += 1
            self._worst = max(self._worst, behind)
            return None
        worst, self._worst = self._worst, 0.0
        return worst or None
