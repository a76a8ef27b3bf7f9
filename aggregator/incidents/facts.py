"""Evidence for the incident tracker, made from what the aggregator already has: divergence
verdicts, alert transitions and rank-health transitions. Pure.

A burst at 4,096 ranks makes one fact per rank, so the common facts are built without the
NamedTuple constructor's Python frame and with their line for people left to ``Fact.line``.
"""

from __future__ import annotations

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.oneline import is_collective_failure, one_line
from rankwatch.aggregator.incidents.rules import Fact
from rankwatch.aggregator.metrics import KNOWN_METRICS

KILL_WORDS = ("sigterm", "sigkill", "terminated", "killed", "signal 9", "signal 15")

__all__ = ["KILL_WORDS", "alert_items", "divergence_fact", "divergence_kind", "health_fact"]

_new = tuple.__new__

_DIVERGENCE_KINDS = {"outlier": rules.OUTLIER, "nonfinite": rules.NONFINITE,
                     "straggler": rules.STRAGGLER}  # fmt: skip

# In synchronous data parallelism every rank waits for the slowest in the all-reduce, so a slow
# rank's step time is everyone's; what stands out is its own time outside the step (data_time),
# which the detector reports as an outlier. An outlier in a timing metric is slowness.
_TIMING_METRICS = frozenset(m.name for m in KNOWN_METRICS if m.unit in ("s", "samples/s"))


def divergence_kind(kind: str, metric: str) -> str:
    out = _DIVERGENCE_KINDS.get(kind, rules.OUTLIER)
    return rules.STRAGGLER if out == rules.OUTLIER and metric in _TIMING_METRICS else out


def divergence_fact(d: Divergence, time: float) -> Fact:
    if d.kind == "nonfinite":  # most of a burst; its line is made when shown
        return _new(Fact, (rules.NONFINITE, d.rank, d.since_step, time, d.metric, "", "", ""))
    kind = divergence_kind(d.kind, d.metric)
    what = f"{d.metric} {d.direction} (z {d.z:.1f}, {d.rel:.2f}x the median)"
    return Fact(kind, d.rank, d.since_step, time, d.metric, what)


_CRASHED, _STALLED, _FINISHED, _LOST = (
    RankState.CRASHED, RankState.STALLED, RankState.FINISHED, RankState.LOST
)  # fmt: skip


def health_fact(h: RankHealth) -> Fact | None:
    state, msg = h.state, h.message
    if state is _CRASHED:
        if is_collective_failure(msg):  # most of a burst: its one line is made when shown
            return _new(Fact, (rules.COLLECTIVE, h.rank, h.last_step, h.since, "", "", "", msg))
        line = one_line(msg)
        if _killed(msg):
            return Fact(rules.KILLED, h.rank, h.last_step, h.since, "", f"killed: {line}", line)
        return Fact(rules.CRASHED, h.rank, h.last_step, h.since, "", f"crashed: {line}", line)
    if state is _STALLED:
        return _new(Fact, (rules.STALLED, h.rank, h.last_step, h.since, "", "", msg, ""))
    if state is _FINISHED and _killed(msg):
        return Fact(rules.KILLED, h.rank, h.last_step, h.since, "", msg, msg)
    if state is _LOST:
        return Fact(rules.LOST, h.rank, h.last_step, h.since, "", f"lost: {msg}", msg)
    return None


def _killed(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in KILL_WORDS)


_ALERT_KINDS = {"nonfinite": rules.NONFINITE, "divergence": rules.OUTLIER,
                "straggler": rules.STRAGGLER}  # fmt: skip

AlertItem = tuple[str, Fact | None, tuple[int, tuple[str, str]] | None]


def alert_items(a: Alert) -> list[AlertItem]:
    """Divergence-rule alerts as evidence (per rank of a grouped alert); health rules come
    through ``health`` with their messages, run-level rules (threshold, plateau, throughput)
    name no rank and are left to the alert sinks."""
    kind = _ALERT_KINDS.get(a.rule)
    if kind is None or a.metric is None:
        return []
    kind = divergence_kind(kind, a.metric)
    ranks = a.ranks or ((a.rank,) if a.rank is not None else ())
    out: list[AlertItem] = []
    for rank in ranks:
        if a.state == "resolved":
            out.append((a.run, None, (rank, (kind, a.metric))))
        else:
            what = "" if kind == rules.NONFINITE else a.message[:200]
            fact = Fact(kind, rank, a.since_step, a.since_time, a.metric, what)
            out.append((a.run, fact, None))
    return out
