"""One word for a run from its ranks' states."""

from __future__ import annotations

from collections.abc import Iterable

from rankwatch.aggregator.health.rules import RankHealth, RankState

# Run states, most urgent first: the first rule that matches names the run.
RUN_STATES = ("empty", "crashed", "lost", "stalled", "finished", "paused", "partial", "running")


def run_state(ranks: Iterable[RankHealth]) -> str:
    """One word for a run from its ranks' health.

    ============ =========================================================================
    ``empty``    no rank seen
    ``crashed``  any rank crashed
    ``lost``     any rank lost (silent too long)
    ``stalled``  any rank stalled
    ``finished`` every rank finished
    ``paused``   every rank paused or finished, at least one paused
    ``partial``  fewer ranks seen than the world size says (still starting, or some never came)
    ``running``  otherwise (alive ranks, possibly some already finished)
    ============ =========================================================================
    """
    ranks = list(ranks)
    if not ranks:
        return "empty"
    world = max(h.world_size for h in ranks)
    return run_state_of({h.state for h in ranks}, len(ranks), world)


def run_state_of(states: set[RankState], ranks: int, world: int) -> str:
    """``run_state`` from the set of its ranks' states, how many ranks and the world size."""
    if not ranks:
        return "empty"
    for state, word in (
        (RankState.CRASHED, "crashed"),
        (RankState.LOST, "lost"),
        (RankState.STALLED, "stalled"),
    ):
        if state in states:
            return word
    if states == {RankState.FINISHED}:
        return "finished"
    if states <= {RankState.PAUSED, RankState.FINISHED}:
        return "paused"
    if ranks < world:
        return "partial"
    return "running"
