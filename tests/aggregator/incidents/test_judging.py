"""Judging from what the columns keep as facts arrive is judging from scratch.

The columns keep their rows' time order, steps and step counts, and the timeline keeps its
groups' ranks, as rows come; the rules read those instead of every rank's fact. Seeded random
sequences of changes go through the kept path and are checked against a full recompute: the
same column rebuilt from its facts, the previous formulation of each rule part that changed,
and every open incident of a tracker judged again on fresh copies of its evidence.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from rankwatch.aggregator.health import RankState
from rankwatch.aggregator.incidents import rules
from rankwatch.aggregator.incidents.columns import Column, Rows
from rankwatch.aggregator.incidents.grouping import Open
from rankwatch.aggregator.incidents.judging import Judge
from rankwatch.aggregator.incidents.progress import least_progress, progress_key
from rankwatch.aggregator.incidents.rules import BY_TIME, Fact, known
from rankwatch.aggregator.incidents.scan import positions
from rankwatch.aggregator.incidents.split import RankSplit
from rankwatch.aggregator.incidents.timeline import Lines, add_group_ranks, group_ranks, timeline
from rankwatch.aggregator.incidents.tracker import IncidentTracker

from tests.aggregator.incidents.builders import RUN, T0, crash_text, crashed, health, nan

SEEDS = range(12)


def burst(rng: random.Random, kind: str, ranks: int, t: float, steps: int = 4) -> Rows:
    """A burst of facts of one kind: random ranks (some twice), steps and times near ``t``."""
    rows = Rows()
    for _ in range(rng.randint(1, 12)):
        rank = rng.randrange(ranks)
        step = rng.choice([None, *range(10, 10 + steps)])
        when = t - rng.choice([0.0, 0.0, 0.5, 3.0, 30.0])  # most now, some late
        rows.add(Fact(kind, rank, step, when, "", rng.choice(["", "", "w"]), "", ""))
    return rows


def fresh(column: Column) -> Column:
    """The column built anew from its facts, in its rows' order: nothing kept from before."""
    rows = Rows()
    for f in column.facts():
        rows.add(f)
    out = Column(column.kind, column.metric)
    out.add(rows, len(rows))
    return out


def contents(c: Column) -> tuple[list, ...]:
    return (c.rank, c.step, c.time, c.what, c.detail, c.raw)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_columns_kept_order_steps_and_counts_are_those_of_its_rows(seed: int) -> None:
    rng = random.Random(seed)
    column = Column(rules.LOST, "")
    t = T0
    for _ in range(60):
        t += rng.choice([0.1, 0.2, 5.0])
        before = [list(x) for x in contents(column)], column.version
        column.add(burst(rng, rules.LOST, 50, t), rng.choice([0, 3, 1000]))
        changed = [list(x) for x in contents(column)] != before[0]
        assert (column.version != before[1]) == changed  # bumped exactly when a row changed
        # each read now and then: what it reads is brought up to date when it is read
        if rng.random() < 0.5:
            assert column.by_time() == sorted(zip(column.time, column.rank, strict=True))
        if rng.random() < 0.5:
            assert column.min_step() == min(known(column.step), default=None)
        if rng.random() < 0.5:
            assert column.step_counts() == Counter(column.step)
        if rng.random() < 0.5:
            for step in (None, 10, 11, 12, 13, 99):
                assert column.rows_at(step) == positions(column.step, step)
        if rng.random() < 0.5:
            assert column.earliest() == min(column.facts(), key=BY_TIME, default=None)
    assert column.by_time() == sorted(zip(column.time, column.rank, strict=True))
    assert column.min_step() == min(known(column.step), default=None)
    assert column.step_counts() == Counter(column.step)
    assert column.earliest() == min(column.facts(), key=BY_TIME, default=None)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_groups_ranks_merged_as_rows_come_are_its_ranks_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    column = Column(rules.COLLECTIVE, "")
    mine = frozenset(rng.sample(range(80), 3))
    held: dict[tuple[int | None, str], tuple[list[int], int, int]] = {}
    t = T0
    for _ in range(40):
        t += 0.2
        column.add(burst(rng, rules.COLLECTIVE, 80, t), 1000)
        for step, what in ((10, ""), (11, "w"), (None, "")):
            kept = held.get((step, what))
            if kept is not None and kept[2] == column.replaced:
                ranks = add_group_ranks(kept[0], column, step, what, mine, kept[1])
            else:
                ranks = group_ranks(column, step, what, mine)
            assert ranks == group_ranks(fresh(column), step, what, mine)
            held[(step, what)] = (ranks, len(column), column.replaced)


def old_first_silent(facts: list[Fact]) -> tuple[tuple[int, ...], int | None]:
    """The lost branch as it was: every fact made and sorted."""
    lost = sorted(facts, key=BY_TIME)
    first = lost[0].time
    seen: dict[int, None] = {}
    for f in lost:
        if f.time - first <= rules.LOST_BURST_S:
            seen.setdefault(f.rank, None)
    return tuple(seen), lost[0].step


@pytest.mark.parametrize("seed", SEEDS)
def test_the_first_silent_ranks_are_found_in_the_kept_order_as_by_a_sort(seed: int) -> None:
    rng = random.Random(seed)
    column = Column(rules.LOST, "")
    t = T0
    for _ in range(50):
        t += rng.choice([0.2, 1.0, 4.0, 12.0])
        column.add(burst(rng, rules.LOST, 60, t), 1000)
        assert rules._lost([column]) == old_first_silent(column.facts())
        assert rules._lost([column]) == rules.first_silent(column.facts())


@pytest.mark.parametrize("seed", SEEDS)
def test_the_kept_split_of_affected_and_terminated_ranks_is_the_split_from_scratch(
    seed: int,
) -> None:
    rng = random.Random(seed)
    evidence: dict[str, dict[str, Column]] = {}
    split = RankSplit()
    culprits: tuple[int, ...] = ()
    t = T0
    for _ in range(60):
        t += 0.2
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice([rules.LOST, rules.KILLED, rules.COLLECTIVE, rules.NONFINITE])
            metric = rng.choice(["loss", "grad_norm"]) if kind == rules.NONFINITE else ""
            column = evidence.setdefault(kind, {}).setdefault(metric, Column(kind, metric))
            column.add(burst(rng, kind, 90, t), rng.choice([5, 1000]))
        pick = rng.random()
        if pick < 0.3:  # more culprits at its end (a loss burst growing)
            culprits += tuple(r for r in rng.sample(range(90), 3) if r not in culprits)
        elif pick < 0.45:  # other culprits
            culprits = tuple(rng.sample(range(90), rng.randint(0, 4)))
        assert split(evidence, culprits) == rules.split_ranks(evidence, culprits)


def old_least_progress(candidates: set[int], table: dict) -> tuple[int, ...]:
    """The least-progress culprits as they were found: a key made per rank, sorted."""
    ranked = sorted(candidates, key=lambda r: progress_key(r, table))
    best = progress_key(ranked[0], table)
    return tuple(r for r in ranked if progress_key(r, table)[:2] == best[:2])


@pytest.mark.parametrize("seed", SEEDS)
def test_the_least_progress_read_column_by_column_is_the_sort_by_rank_keys(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(30):
        n = rng.randint(1, 40)
        table = {
            r: health(r, RankState.STALLED, step=rng.choice([18, 19, 19, 20]),
                      progress=T0 + rng.choice([0.0, 0.0, 1.5]))
            for r in range(n) if rng.random() < 0.95  # a candidate or two unknown, now and then
        }  # fmt: skip
        if table and rng.random() < 0.2:  # a rank stalled before its first step
            rank = rng.choice(list(table))
            table[rank] = health(rank, RankState.STALLED, step=None)
        candidates = set(rng.sample(range(n), rng.randint(1, n)))
        assert least_progress(candidates, table) == old_least_progress(candidates, table)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_named_ranks_earliest_silence_read_from_columns_is_that_of_their_facts(
    seed: int,
) -> None:
    rng = random.Random(seed)
    for _ in range(10):
        columns = []
        for kind in (rules.LOST, rules.KILLED):
            if rng.random() < 0.7:
                column = Column(kind, "")
                for _ in range(rng.randint(1, 3)):
                    column.add(burst(rng, kind, 60, T0 + rng.random() * 50), rng.choice([5, 1000]))
                columns.append(column)
        named = set(rng.sample(range(60), rng.choice([0, 1, 3, 30, 60])))
        facts = [f for c in columns for f in c.facts() if f.rank in named]
        assert rules._earliest_time(columns, named) == min((f.time for f in facts), default=None)


@pytest.mark.parametrize(
    ("states", "failed", "found"),
    [
        ({0: RankState.ALIVE, 1: RankState.CRASHED, 2: RankState.CRASHED}, {1, 2}, [0]),
        ({0: RankState.ALIVE, 1: RankState.ALIVE, 2: RankState.CRASHED}, {2}, None),  # too many
        ({0: RankState.FINISHED, 1: RankState.CRASHED}, {1}, []),  # finished normally
        ({0: RankState.ALIVE, 1: RankState.ALIVE}, set(), None),
    ],
)
def test_the_ranks_waited_for_are_cut_once_they_outnumber_the_failed(
    states: dict[int, RankState], failed: set[int], found: list[int] | None
) -> None:
    table = {r: health(r, s, message="normal end" if s is RankState.FINISHED else "")
             for r, s in states.items()}  # fmt: skip
    normal = {
        r for r, h in table.items() if h.state is RankState.FINISHED and "normal" in h.message
    }
    old = [r for r in table.keys() - failed if r not in normal]  # the list as it was
    got = rules._waited_for(table, failed)
    usable = bool(got) and len(got) <= len(failed)
    assert usable == (bool(old) and len(old) <= len(failed))
    if found is None:
        assert not usable
    else:
        assert sorted(got) == sorted(old) == found


# --- a tracker's judgements against a judgement on fresh copies of the evidence --------------

PEER = crash_text("mindspore_allreduce_kernel.txt")


def changes(rng: random.Random, n: int, t: float, steps: dict[int, int]) -> dict[str, list]:
    """One tick of a run of ``n`` ranks: a few ranks change state, a few go non-finite."""
    out: dict[str, list] = {"health": [], "divergences": []}
    for rank in rng.sample(range(n), rng.randint(1, 8)):
        since = t - rng.choice([0.0, 0.0, 0.4, 8.0])
        step = steps[rank] = max(1, steps[rank] + rng.choice([-1, 0, 1, 1]))
        pick = rng.random()
        if pick < 0.3:
            h = health(rank, RankState.LOST, world=n, step=step, since=since,
                       message="no record for 12 s")  # fmt: skip
        elif pick < 0.45:
            h = health(rank, RankState.ALIVE, world=n, step=step, since=since)
        elif pick < 0.6:
            h = health(rank, RankState.STALLED, world=n, step=step, since=since,
                       message="no step for 30 s")  # fmt: skip
        elif pick < 0.75:
            h = crashed(rank, PEER, world=n, since=since, step=step)
        elif pick < 0.8:
            h = crashed(rank, "ValueError: injected fault", world=n, since=since, step=step)
        elif pick < 0.85:
            h = health(rank, RankState.FINISHED, world=n, step=step, since=since,
                       message="exit: terminated by SIGTERM")  # fmt: skip
        else:
            out["divergences"].append(
                nan(rank, step + rng.choice([0, 1]), rng.choice(["loss", "grad_norm"]))
            )
            continue
        out["health"].append(h)
    return out


def copy_of(inc: Open) -> Open:
    """``inc`` with every column built anew and nothing kept from earlier judgements."""
    out = Open(inc.id, inc.run, inc.opened, count=inc.count, members=set(inc.members),
               last=inc.last, first=inc.first, first_time=inc.first_time,
               first_step=inc.first_step, early=list(inc.early))  # fmt: skip
    out.evidence = {k: {m: fresh(c) for m, c in cs.items()} for k, cs in inc.evidence.items()}
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_a_trackers_incidents_are_those_judged_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([16, 40, 64])
    t, steps = T0, dict.fromkeys(range(n), 20)
    tracker = IncidentTracker()
    tracker.observe(t, health=[health(r, world=n, since=t) for r in range(n)])
    judge = Judge(
        tracker.config.window_s, tracker.config.timeline_max, 2 * tracker.config.timeline_max
    )
    judged = 0
    for _ in range(80):
        t += rng.choice([0.2, 0.2, 1.0, 6.0, 40.0])
        tracker.observe(t, **changes(rng, n, t, steps))
        run = tracker._runs[RUN]
        for inc in run.open:
            if inc.value is None or inc.verdict is None or inc.value.updated != t:
                continue  # judged before this tick, on the health of then
            again = copy_of(inc)
            verdict = rules.judge(again.evidence, run.health, list, run.world)
            assert verdict == inc.verdict
            shown = timeline(again, verdict, judge.timeline_max, judge.early_max, Lines())
            assert shown == inc.value.timeline
            assert (inc.value.culprits, inc.value.affected, inc.value.terminated) == (
                verdict.culprits,
                verdict.affected,
                verdict.terminated,
            )
            judged += 1
    assert judged > 0
