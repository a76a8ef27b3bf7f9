"""Evidence for the incident tracker, made from what the aggregator already has: divergence
verdicts, alert transitions and rank-health transitions. Pure.

A burst at 4,096 ranks makes one fact per rank, so the common facts are built without the
NamedTuple constructor's Python frame and with their line for people left to ``Fact.line``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress, islice, repeat
from operator import attrgetter, eq

from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.columns import Rows
from rankwatch.aggregator.incidents.oneline import (
    collective_failures,
    is_collective_failure,
    one_line,
)
from rankwatch.aggregator.incidents.rules import Fact
from rankwatch.aggregator.incidents.scan import positions
from rankwatch.aggregator.metrics import KNOWN_METRICS

KILL_WORDS = ("sigterm", "sigkill", "terminated", "killed", "signal 9", "signal 15")

__all__ = [
    "KILL_WORDS", "alert_items", "alert_kind", "divergence_fact", "divergence_facts",
    "divergence_kind", "health_columns", "health_fact", "health_facts",
]  # fmt: skip

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


def divergence_facts(
    ds: Sequence[Divergence],
    run: str,
    now: float,
    times: Mapping[tuple[str, int, int], float] | None,
    rows: Rows,
) -> None:
    """``divergence_fact`` of each of a burst of one run's verdicts, added to ``rows``; a burst
    of non-finite verdicts (the common one) column by column, in C."""
    if not all(map(eq, map(_KIND, ds), repeat("nonfinite"))):
        for d in ds:
            rows.add(divergence_fact(d, times.get((run, d.rank, d.since_step), now)
                                     if times else now))  # fmt: skip
        return
    ranks, steps = list(map(_RANK, ds)), list(map(_SINCE, ds))
    when = map(times.get, zip(repeat(run), ranks, steps), repeat(now)) if times else repeat(now)
    rows.extend(rules.NONFINITE, ranks, steps, islice(when, len(ranks)), list(map(_METRIC, ds)))


_KIND, _RANK, _SINCE, _METRIC = (
    attrgetter("kind"), attrgetter("rank"), attrgetter("since_step"), attrgetter("metric")
)  # fmt: skip
_STATE, _STEP, _AT, _MESSAGE = (
    attrgetter("state"), attrgetter("last_step"), attrgetter("since"), attrgetter("message")
)  # fmt: skip

_CRASHED, _STALLED, _FINISHED, _LOST = (
    RankState.CRASHED, RankState.STALLED, RankState.FINISHED, RankState.LOST
)  # fmt: skip
_NO_FACT = {RankState.ALIVE, RankState.PAUSED}  # states ``health_fact`` makes nothing of


def health_fact(h: RankHealth) -> Fact | None:
    state, msg = h.state, h.message
    if state is _CRASHED:
        if is_collective_failure(msg):  # most of a burst: its one line is made when shown
            return _new(Fact, (rules.COLLECTIVE, h.rank, h.last_step, h.since, "", "", "", msg))
        return _crash_fact(h)
    if state is _STALLED:
        return _new(Fact, (rules.STALLED, h.rank, h.last_step, h.since, "", "", msg, ""))
    if state is _FINISHED and _killed(msg):
        return Fact(rules.KILLED, h.rank, h.last_step, h.since, "", msg, msg)
    if state is _LOST:
        return Fact(rules.LOST, h.rank, h.last_step, h.since, "", f"lost: {msg}", msg)
    return None


def health_facts(
    hs: list[RankHealth], rows: Rows, ranks: list[int] | None = None
) -> list[RankHealth]:
    """``health_fact`` of each of a burst of health values, added to ``rows``; returns the
    values that make none (recovered ranks and the like). A burst of stalls or of crashes, the
    big ones, goes column by column, in C. The tracker puts the rows in (time, rank) order, so
    their order here matters only for a rank that comes twice: then they keep the burst's.
    ``ranks``: their ranks, when the caller has them already."""
    states = list(map(_STATE, hs))
    if set(states) <= _NO_FACT:
        return list(hs)
    return health_columns(hs, rows, ranks if ranks is not None else list(map(_RANK, hs)), states)


def health_columns(
    hs: list[RankHealth], rows: Rows, ranks: list[int], states: list[RankState]
) -> list[RankHealth]:
    """``health_facts`` of a burst whose ranks and states are in hand (``HealthChanges``)."""
    kinds = set(states)
    if kinds <= _NO_FACT:
        return list(hs)
    if len(kinds) == 1:
        parts = [(kinds.pop(), hs, ranks)]
    elif len(set(ranks)) < len(hs):
        return _one_by_one(hs, rows)
    else:
        parts = []
        for k in kinds:
            mask = list(map(eq, states, repeat(k)))
            parts.append((k, list(compress(hs, mask)), list(compress(ranks, mask))))
    rest: list[RankHealth] = []
    for state, part, every in parts:
        if state is _STALLED:
            rows.extend(rules.STALLED, every, map(_STEP, part), map(_AT, part),
                        detail=map(_MESSAGE, part))  # fmt: skip
        elif state is _CRASHED:
            texts = list(map(_MESSAGE, part))
            collective = collective_failures(texts)
            mine = positions(collective, False)  # not collective failures: most often a few
            own = list(map(part.__getitem__, mine))
            # the peers: every column of the burst less the few rows of its own crashes
            peer_ranks, peer_steps = list(every), list(map(_STEP, part))
            peer_times, raw = list(map(_AT, part)), texts
            for row in reversed(mine):
                del peer_ranks[row], peer_steps[row], peer_times[row], raw[row]
            if own and not set(map(_RANK, own)).isdisjoint(peer_ranks):
                rest += _one_by_one(part, rows)  # a rank twice, both ways: as they came
                continue
            for h in own:  # first: the culprit's crash is most often earliest, rows in order
                rows.add(_crash_fact(h))
            rows.extend(rules.COLLECTIVE, peer_ranks, peer_steps, peer_times, raw=raw)
        elif state in _NO_FACT:
            rest += part
        else:
            rest += _one_by_one(part, rows)
    return rest


def _one_by_one(hs: Sequence[RankHealth], rows: Rows) -> list[RankHealth]:
    rest: list[RankHealth] = []
    for h in hs:
        fact = health_fact(h)
        if fact is None:
            rest.append(h)
        else:
            rows.add(fact)
    return rest


def _crash_fact(h: RankHealth) -> Fact:
    """A crash that is not a collective failure: its own, or the launcher's kill."""
    msg = h.message
    line = one_line(msg)
    if _killed(msg):
        return Fact(rules.KILLED, h.rank, h.last_step, h.since, "", f"killed: {line}", line)
    return Fact(rules.CRASHED, h.rank, h.last_step, h.since, "", f"crashed: {line}", line)


def _killed(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in KILL_WORDS)


_ALERT_KINDS = {"nonfinite": rules.NONFINITE, "divergence": rules.OUTLIER,
                "straggler": rules.STRAGGLER}  # fmt: skip

AlertItem = tuple[str, Fact | None, tuple[int, tuple[str, str]] | None]


def alert_kind(a: Alert) -> str | None:
    """The kind of fact a divergence-rule alert is evidence of (None: it is none)."""
    kind = _ALERT_KINDS.get(a.rule)
    if kind is None or a.metric is None:
        return None
    return divergence_kind(kind, a.metric)


def alert_items(a: Alert, ranks: Sequence[int] | None = None) -> list[AlertItem]:
    """Divergence-rule alerts as evidence (per rank of a grouped alert; ``ranks``: only those
    of its ranks); health rules come through ``health`` with their messages, run-level rules
    (threshold, plateau, throughput) name no rank and are left to the alert sinks."""
    kind = alert_kind(a)
    if kind is None or a.metric is None:
        return []
    if ranks is None:
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
