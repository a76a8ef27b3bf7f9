"""A grouped alert kept up to date by the conditions that changed equals one built from scratch."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from rankwatch.aggregator.alerts.conds import Cond, Conds, cond_key, key_words
from rankwatch.aggregator.alerts.config import SEVERITIES, AlertConfig
from rankwatch.aggregator.alerts.grouping import MinCount
from rankwatch.aggregator.alerts.rules import FULL_PASS_RANKS, Alert, AlertEngine
from rankwatch.aggregator.health import RankHealth, RankState

GROUP = ("lost", "r", None)


def cond(rng: random.Random, rank: int) -> Cond:
    step = rng.choice([None, rng.randrange(10**6)])
    return Cond("lost", "r", rank, None, step, float(rng.randrange(10**6)), rng.random(),
                f"rank {rank} gone", rng.choice(SEVERITIES))  # fmt: skip


def scratch(conds: list[Cond]) -> tuple:
    """What a grouped alert needs, from every condition of the group."""
    ranks = tuple(sorted(c.rank for c in conds if c.rank is not None))
    steps = [c.since_step for c in conds if c.since_step is not None]
    return (
        ranks,
        min(steps) if steps else None,
        min(c.since_time for c in conds),
        max({c.severity for c in conds}, key=SEVERITIES.index),
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_group_kept_by_its_changes_equals_one_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    conds = Conds()
    for r in rng.sample(range(3000), 300):
        conds.put(cond(rng, r))
    for _ in range(60):
        # a few changes (merged in order) or many (sorted again): adds, drops, new words
        for _ in range(rng.choice([1, 5, 40, 400])):
            r = rng.randrange(3000)
            key = f"lost|r|{r}|"
            if conds.get(key) is not None and rng.random() < 0.5:
                conds.pop(key)
            else:
                conds.put(cond(rng, r))
        members = list(conds.group(GROUP).values())
        group = conds.ranked(GROUP)
        if not members:
            assert group is None
            continue
        assert group is not None
        got = (group.ranks(), group.since_step(), group.since_time(), group.severity())
        assert got == scratch(members)


def test_a_minimum_under_removes() -> None:
    rng = random.Random(7)
    m: MinCount[int] = MinCount()
    held: list[int] = []
    for _ in range(3000):
        if held and rng.random() < 0.5:
            v = held.pop(rng.randrange(len(held)))
            m.remove(v)
        else:
            v = rng.randrange(30)
            held.append(v)
            m.add(v)
        assert m.min() == (min(held) if held else None)


def rh(rank: int, state: RankState, since: float) -> RankHealth:
    return RankHealth("r", rank, state, "node1", 1, 4, rank % 7, 0.0, 0.0, f"m{since:g}", 0, 1.0,
                      since)  # fmt: skip


def grouped(eng: AlertEngine) -> list[Alert]:
    return [replace(a, time=0.0) for a in eng.firing() if a.rank is None]


@pytest.mark.parametrize("seed", range(2))
def test_a_big_run_s_grouped_alert_given_its_changes_equals_a_fresh_engine_s(seed: int) -> None:
    rng = random.Random(seed)
    n = FULL_PASS_RANKS + 200
    states = [RankState.ALIVE, RankState.LOST, RankState.STALLED, RankState.CRASHED]
    table = {r: rh(r, RankState.LOST if r % 3 else RankState.ALIVE, 0.0) for r in range(n)}
    told = AlertEngine(AlertConfig(group_ranks=8))
    told.evaluate(0.0, health={"r": dict(table)}, hardware=[])
    for call in range(1, 10):
        changed = rng.sample(range(n), rng.choice([1, 30, 600]))
        for r in changed:
            table[r] = rh(r, rng.choice(states), float(call))
        told.evaluate(float(call), health={"r": dict(table)}, hardware=[],
                      health_changed={("r", r) for r in changed})  # fmt: skip
        fresh = AlertEngine(AlertConfig(group_ranks=8))
        fresh.evaluate(float(call), health={"r": dict(table)}, hardware=[])
        assert grouped(told) == grouped(fresh), f"seed {seed}, call {call}"
    lost = [r for r, h in table.items() if h.state is RankState.LOST]
    (alert,) = [a for a in told.firing() if a.rule == "lost"]
    assert alert.ranks == tuple(lost) and len(lost) > 1024


@pytest.mark.parametrize("seed", range(4))
def test_a_group_put_many_at_once_equals_one_put_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    one, many = Conds(), Conds()
    for _ in range(40):
        # a batch of conditions (a cascade's step, or a few), some replacing ones held, and now
        # and then a few dropped in between
        batch = {}
        for r in rng.sample(range(2000), rng.choice([1, 3, 50, 600])):
            c = cond(rng, r)
            batch[c.key] = c
        for c in batch.values():
            one.put(c)
        many.put_many(GROUP, batch)
        for key in rng.sample(sorted(batch), min(len(batch), rng.choice([0, 2, 30]))):
            one.pop(key)
            many.pop(key)
        assert list(one.values()) == list(many.values())
        assert list(one.group(GROUP).items()) == list(many.group(GROUP).items())
        a, b = one.ranked(GROUP), many.ranked(GROUP)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            parts = lambda g: (g.ranks(), g.since_step(), g.since_time(), g.severity())  # noqa: E731
            assert parts(a) == parts(b) == scratch(list(many.group(GROUP).values()))
        assert one.take_dirty() == many.take_dirty()
    many.put_many(GROUP, {})  # nothing: nothing changes
    assert many.take_dirty() == []


def test_a_minimum_takes_many_values_at_once() -> None:
    one, many = MinCount[int](), MinCount[int]()
    values = [5, 3, 3, 9, 3, 5, 1]
    for v in values:
        one.add(v)
    many.add_many(values)
    for v in (1, 3, 3):
        one.remove(v)
        many.remove(v)
        assert one.min() == many.min()
    assert many.min() == 3


@pytest.mark.parametrize("metric", ["loss", None, ""])
def test_a_groups_key_words_make_the_key_of_each_rank(metric: str | None) -> None:
    head, tail = key_words("nonfinite", "run|a", metric)
    for rank in (0, 7, 99_999):
        assert f"{head}{rank}{tail}" == cond_key("nonfinite", "run|a", rank, metric)
