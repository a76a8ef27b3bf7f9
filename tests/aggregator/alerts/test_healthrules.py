"""A big run's straggler rule, kept by the ranks evaluated again, equals a pass over every rank."""

from __future__ import annotations

import random
from operator import attrgetter

import pytest
from rankwatch.aggregator.alerts.config import AlertConfig
from rankwatch.aggregator.alerts.rules import FULL_PASS_RANKS, AlertEngine
from rankwatch.aggregator.health import RankHealth, RankState


def rh(rank: int, state: RankState, step: int | None) -> RankHealth:
    return RankHealth("r", rank, state, "node1", 1, 4, step, 0.0, 0.0, "", 0, 1.0, 0.0)


@pytest.mark.parametrize(("seed", "group"), [(0, 10_000), (1, 8)])
def test_stragglers_kept_by_the_ranks_evaluated_equal_a_full_pass(seed: int, group: int) -> None:
    rng = random.Random(seed)
    n = FULL_PASS_RANKS + 300
    states = [RankState.ALIVE, RankState.ALIVE, RankState.STALLED, RankState.LOST]
    table = {r: rh(r, RankState.ALIVE, 100 + rng.randrange(3)) for r in range(n)}
    full, told = (AlertEngine(AlertConfig(group_ranks=group)) for _ in range(2))
    for eng in (full, told):
        eng.evaluate(0.0, health={"r": dict(table)}, hardware=[])
    stragglers = 0
    for call in range(1, 12):
        evaluated = rng.sample(range(n), rng.choice([1, 40, 900]))
        changed = set()
        for r in evaluated:  # steps move (a few far behind), some states change
            old = table[r]
            step = rng.choice([None, 0, 100 + call + rng.randrange(3), 100 + call])
            state = rng.choice(states) if rng.random() < 0.2 else old.state
            table[r] = rh(r, state, step)
            if state is not old.state:
                changed.add(("r", r))
        snap = {"r": dict(table)}
        a = full.evaluate(float(call), health=snap, hardware=[])
        b = told.evaluate(float(call), health=snap, hardware=[], health_changed=changed,
                          health_evaluated={("r", r) for r in evaluated})  # fmt: skip
        key = attrgetter("key", "state")  # a pass given its changes publishes in their order
        assert sorted(a, key=key) == sorted(b, key=key)
        assert full.firing() == told.firing(), f"call {call}"
        stragglers += sum(x.rule == "straggler" for x in told.firing())
    assert stragglers > 0
