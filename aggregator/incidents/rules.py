"""Culprit rules: from one incident's evidence (and the run's ranks and stacks) to its cause,
culprits, affected and terminated ranks and one sentence. Pure; order of arrival does not matter
(the rules sort the evidence themselves), so a late record can change the verdict.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import compress, islice
from operator import is_not, itemgetter, not_
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents import sentence
from rankwatch.aggregator.incidents.oneline import one_line
from rankwatch.aggregator.incidents.progress import least_progress, progress_key
from rankwatch.aggregator.incidents.stacks import StackGroup, odd_ones_out, summary_line

if TYPE_CHECKING:
    from rankwatch.aggregator.incidents.columns import Column

# Kinds of evidence (the tracker makes them from verdicts, alerts and health).
NONFINITE, OUTLIER, STRAGGLER = "nonfinite", "outlier", "straggler"
STALLED, LOST, CRASHED, COLLECTIVE, KILLED = "stalled", "lost", "crashed", "collective", "killed"


class Fact(NamedTuple):  # a tuple: a burst makes one per rank
    kind: str
    rank: int
    step: int | None
    time: float
    metric: str  # "" for health facts
    what: str  # the evidence line for people ("" until asked for: see ``line``)
    detail: str = ""  # one-line crash message of a crash that is not a collective failure
    raw: str = ""  # the crash message, made into a line only for the few facts shown

    @property
    def line(self) -> str:
        if self.what:
            return self.what
        if self.kind == NONFINITE:
            return f"{self.metric} non-finite"
        if self.kind == STALLED:
            return f"stalled at step {self.step}"
        return f"crashed: {one_line(self.raw)}"


BY_TIME = itemgetter(3, 1, 0, 4)  # (time, rank, kind, metric): unique within an incident
_STEP = itemgetter(2)
_KNOWN = partial(is_not, None)  # "is not None", as a function for filter()
_T = TypeVar("_T")


def known(values: Iterable[_T | None]) -> Iterator[_T]:
    """The values that are not None, filtered in C."""
    return cast("Iterator[_T]", filter(_KNOWN, values))


# An incident's evidence: kind -> metric -> its facts as columns, one row per rank. The tracker
# keeps it this way as facts arrive, so a judgement costs a few passes in C over the kinds it
# needs, and makes a ``Fact`` only of the few rows it names.
Evidence = Mapping[str, Mapping[str, "Column"]]
Groups = Callable[[], list[StackGroup]]  # the run's stall stacks, grouped; asked for lazily
# (evidence, culprits) -> (affected, terminated): ``split_ranks``, or one that keeps it
Split = Callable[[Evidence, tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]
# (candidates, health) -> the least far: ``least_progress``, or one that keeps it
Least = Callable[[set[int], Mapping[int, RankHealth]], tuple[int, ...]]


@dataclass(frozen=True)
class Verdict:
    cause: str
    culprits: tuple[int, ...]
    affected: tuple[int, ...]
    terminated: tuple[int, ...]
    basis: str
    summary: str
    step: int | None
    own: list[Fact]  # the culprits' evidence by time (of the first ``OWN_RANKS`` culprits)


OWN_RANKS = 64  # culprits whose evidence a verdict lists


def judge(
    evidence: Evidence,
    health: Mapping[int, RankHealth],
    groups: Groups,
    world: int = 0,
    split: Split | None = None,
    least: Least = least_progress,
) -> Verdict:
    """``world``: the run's world size (0: the ranks ``health`` knows). ``split``: what
    ``split_ranks`` gives, when the caller keeps it (``split.RankSplit``); ``least``: what
    ``least_progress`` gives, when the caller keeps it (``progress.KeptLeast``)."""
    nonfinite = _columns(evidence, NONFINITE)
    roots = sorted(_values(evidence, CRASHED), key=BY_TIME)
    nf0 = _earliest(nonfinite)
    if nf0 is not None and (not roots or nf0.time <= roots[0].time):
        cause, culprits, basis, step = _nonfinite(nonfinite, world or len(health))
    elif roots:
        cause, culprits, basis, step = _crash(roots)
    elif COLLECTIVE in evidence or STALLED in evidence:
        cause, culprits, basis, step = _hang(evidence, health, groups, least)
    elif LOST in evidence or KILLED in evidence:
        culprits, step = _lost(_columns(evidence, LOST) or _columns(evidence, KILLED))
        cause, basis = "lost", "went silent first"
        if len(culprits) > 1 and len(culprits) >= (world or len(health)):
            # Every rank at once is the job, its network or the path to this head node, not a
            # card: naming them all culprits would paint the whole run red.
            basis = "every rank went silent at once: no single culprit"
    elif OUTLIER in evidence:
        out = sorted(_values(evidence, OUTLIER), key=lambda f: (f.step or 0, f.time, f.rank))
        cause, basis, step = "divergence", "diverged while the others agreed", out[0].step
        culprits = _ordered(out)
    else:
        slow = sorted(_values(evidence, STRAGGLER), key=BY_TIME)
        cause, basis = "slow", "slower than the others"
        culprits, step = _ordered(slow), (slow[0].step if slow else None)
    affected, terminated = (split or split_ranks)(evidence, culprits)
    own = facts_of_ranks(evidence, culprits[:OWN_RANKS])
    later = (
        _first_step_of_others(_columns(evidence, NONFINITE), set(culprits))
        if cause == "nonfinite"
        else None
    )
    summary = sentence.summary(
        cause, culprits, affected, terminated, health, basis, step, own, later
    )
    return Verdict(cause, culprits, affected, terminated, basis, summary, step, own)


def split_ranks(
    evidence: Evidence, culprits: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(affected, terminated): the ranks other than the culprits with evidence of a kind other
    than silence, and those only lost or killed, each ascending."""
    bad: set[int] = set()
    silent: set[int] = set()
    for kind, columns in evidence.items():
        for column in columns.values():
            (silent if kind in (LOST, KILLED) else bad).update(column.at)
    mine = set(culprits)
    bad -= mine
    return tuple(sorted(bad)), tuple(sorted(silent - mine - bad))


def _columns(evidence: Evidence, kind: str) -> list[Column]:
    columns = evidence.get(kind)
    return [c for c in columns.values() if len(c)] if columns else []


def _values(evidence: Evidence, kind: str) -> list[Fact]:
    """Every fact of a kind, made: for the kinds a burst does not bring by the thousand."""
    return [f for c in _columns(evidence, kind) for f in c.facts()]


def _ranks(columns: Iterable[Column]) -> set[int]:
    out: set[int] = set()
    for c in columns:
        out.update(c.at)
    return out


def _earliest(columns: Iterable[Column]) -> Fact | None:
    return min(known(c.earliest() for c in columns), key=BY_TIME, default=None)


def _min_step_of(columns: Iterable[Column]) -> int | None:
    return min(known(c.min_step() for c in columns), default=None)


def facts_of_ranks(evidence: Evidence, ranks: Iterable[int]) -> list[Fact]:
    """The facts of ``ranks`` (a few: the culprits), by time: looked up, not searched for."""
    wanted = list(ranks)
    out: list[Fact] = []
    for columns in evidence.values():
        for c in columns.values():
            found = map(c.get, wanted)
            out += known(found)
    return sorted(out, key=BY_TIME)


LOST_BURST_S = 10.0  # ranks silent within this of the first are one loss (a switch, a node)


def first_silent(facts: Iterable[Fact]) -> tuple[tuple[int, ...], int | None]:
    """The ranks of ``facts`` (losses or kills) silent within ``LOST_BURST_S`` of the first,
    in time order, and the first one's step."""
    lost = sorted(facts, key=BY_TIME)
    first = lost[0].time
    return _ordered(f for f in lost if f.time - first <= LOST_BURST_S), lost[0].step


def _lost(columns: list[Column]) -> tuple[tuple[int, ...], int | None]:
    """``first_silent`` of the columns' facts. Health brings one column per kind (no metric):
    its time order is kept as ranks come, so the burst is a bisection, not a sort of every
    silent rank's fact."""
    if len(columns) != 1:
        return first_silent(f for c in columns for f in c.facts())
    (column,) = columns
    order = column.by_time()
    first = order[0][0]
    # ``time - first`` grows along the order: the burst ends where it first passes the limit
    end = bisect_left(order, True, key=lambda key: key[0] - first > LOST_BURST_S)
    return tuple(map(_SECOND, islice(order, end))), column.step[column.at[order[0][1]]]


_SECOND = itemgetter(1)


def _ordered(facts: Iterable[Fact]) -> tuple[int, ...]:
    seen: dict[int, None] = {}
    for f in facts:
        seen.setdefault(f.rank, None)
    return tuple(seen)


def _nonfinite(columns: list[Column], world: int) -> tuple[str, tuple[int, ...], str, int | None]:
    s0 = _min_step_of(columns)
    per_metric: dict[str, tuple[Column, list[int]]] = {}
    for c in columns:  # one column per metric, one row per rank
        rows = c.rows_at(s0)
        if rows:
            per_metric[c.metric] = (c, rows)
    # A value taken after the collective (a reduced gradient norm) is non-finite on every rank
    # at the fault step; the metric with the fewest non-finite ranks there names the card.
    metric, (column, rows) = min(per_metric.items(), key=lambda kv: (len(kv[1][1]), kv[0]))
    # by (time, rank): ``BY_TIME`` within one column, whose ranks are distinct (in C, no facts)
    times, ranks = map(column.time.__getitem__, rows), map(column.rank.__getitem__, rows)
    by_time = zip(times, ranks, strict=True)
    culprits = tuple(map(_SECOND, sorted(by_time)))
    if len(culprits) > 1 and len(culprits) >= world:
        basis = f"every rank non-finite at step {s0} at once ({metric}): no single culprit"
    else:
        basis = f"non-finite first, at step {s0} ({metric})"
    return "nonfinite", culprits, basis, s0


def _crash(roots: list[Fact]) -> tuple[str, tuple[int, ...], str, int | None]:
    first = roots[0]
    # The same error on several ranks is one bug hit everywhere: all are culprits.
    same = [f for f in roots if f.detail == first.detail]
    return "crash", _ordered(same), "crashed first, not in a collective", first.step


def _stop_step(
    culprits: tuple[int, ...], health: Mapping[int, RankHealth], peers: int | None
) -> int | None:
    """The step hung ranks stopped after, when no stall report says it. The health held for a
    rank is that of its last state change, which for a rank still "alive" may be long ago (its
    first sight, before any step). The peers could not finish a step whose collectives it had
    not joined, so it got to at least the step before theirs (``peers``: the earliest step of
    their collective failures); an older step is stale, and theirs is the better guess."""
    known = min(
        (s for r in culprits if r in health and (s := health[r].last_step) is not None),
        default=None,
    )
    stale = peers is not None and (known is None or known < peers - 1)
    return peers if stale else known


def _hang(
    evidence: Evidence, health: Mapping[int, RankHealth], groups: Groups, least: Least
) -> tuple[str, tuple[int, ...], str, int | None]:
    collective = _columns(evidence, COLLECTIVE)
    stalled = _columns(evidence, STALLED)
    silent = _columns(evidence, LOST) + _columns(evidence, KILLED)  # read as columns, no facts
    step = _min_step_of(stalled)
    peers_step = _min_step_of(collective)
    grouped = groups()
    odd = odd_ones_out(grouped)
    if odd:
        if step is None:
            step = _stop_step(odd, health, peers_step)
        return "hang", odd, f"stacks: {summary_line(grouped)}", step
    first_failure = _earliest(collective)
    failed = _ranks(collective) if first_failure is not None else set()
    waited_for = _waited_for(health, failed) if first_failure is not None else []
    if first_failure is not None and waited_for and len(waited_for) <= len(failed):
        culprits = tuple(sorted(waited_for, key=lambda r: progress_key(r, health)))
        cause, named = "hang", set(culprits)
        first_silence = _earliest_time(silent, named)
        if step is None:  # no stall seen: the step they stopped after
            step = _stop_step(culprits, health, peers_step)
        if first_silence is not None and first_silence < first_failure.time:
            cause = "lost"
        return cause, culprits, "its peers failed in collectives waiting for it", step
    if first_failure is not None and not stalled:
        return (
            "crash",
            (first_failure.rank,),
            "first to fail; every rank failed in a collective",
            first_failure.step,
        )
    candidates = _ranks(stalled) | _ranks(silent)
    if not candidates:
        return "hang", (), "no candidate", step
    culprits = least(candidates, health)
    if len(culprits) == len(candidates) and len(culprits) > 1:
        basis = "every rank stopped at the same step at the same time: no stacks to tell them apart"
    else:
        basis = "least progress (no stacks)"
    return "hang", culprits, basis, step


def _earliest_time(columns: list[Column], ranks: set[int]) -> float | None:
    """The earliest time of the rows of ``ranks`` in ``columns``: looked up when the ranks are
    fewer than a column's rows, else the column's rows filtered."""
    times: list[float] = []
    for c in columns:
        if len(ranks) < len(c):
            rows = list(known(map(c.at.get, ranks)))
        else:
            rows = [row for rank, row in c.at.items() if rank in ranks]
        times += map(c.time.__getitem__, rows)
    return min(times, default=None)


def _waited_for(health: Mapping[int, RankHealth], failed: set[int]) -> list[int]:
    """The ranks not failed in a collective and not finished normally, while they are no more
    than the failed ones (past that the caller has no use for them: a longer list is cut)."""
    out: list[int] = []
    most = len(failed)
    for r in health.keys() - failed:  # a set difference in C: the few left are looked at
        h = health[r]
        if not (h.state is RankState.FINISHED and "normal" in h.message):
            out.append(r)
            if len(out) > most:
                break
    return out


def _first_step_of_others(columns: list[Column], culprits: set[int]) -> int | None:
    """The earliest step at which a rank other than the culprits is non-finite."""
    lows = []
    for c in columns:
        counts = c.step_counts()
        steps = sorted(known(counts))
        mine = [c.step[row] for r in culprits if (row := c.at.get(r)) is not None]
        if len(steps) <= _FEW_STEPS and len(mine) <= _FEW_STEPS:
            # a few steps and culprits (the common case): the column counts its steps
            lows.append(next((s for s in steps if counts[s] > mine.count(s)), None))
            continue
        others = map(culprits.__contains__, c.rank)
        lows.append(min(known(compress(c.step, map(not_, others))), default=None))
    return min(known(lows), default=None)


_FEW_STEPS = 16
