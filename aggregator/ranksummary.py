"""A big run's ranks as a summary: counts by state and the few ranks with something to say.

At 100,000 ranks every rank's entry is ~70 MB of JSON and seconds to build, and nobody reads
100,000 rows: ``/api/status``, ``/metrics``, ``rankwatch status`` and the live stream show a run
of more than ``SUMMARY_RANKS`` ranks as ``rank_states`` (state -> count) plus the entries of its
odd ranks (not alive, divergent, missing records or dropping them), the most urgent first, at
most ``ODD_RANKS_SHOWN``; the full list is read a page at a time (``offset``, ``limit``).

Pure. The digest of a run's health (counts, the odd ranks by health, the run's state and
extent) is read off what the run's ``RankTable`` keeps up as its ranks change state, not
counted over every rank, and at most once per health snapshot (``DigestCache``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankwatch.aggregator.health import RankHealth, RankState, RankTable, run_state_of
from rankwatch.aggregator.health.table import tally_of

SUMMARY_RANKS = 1024  # a run with more ranks than this is summarised
ODD_RANKS_SHOWN = 100  # odd ranks listed in a summary (the rest are counted)
MAX_PAGE_RANKS = 10_000  # ranks in one page of the full list
DIGEST_EVERY_S = 1.0  # a big run's counts are at most this old (the health sweep's own period)

# Which odd ranks come first when there are more than ODD_RANKS_SHOWN: the states that stop a
# job, then divergence, then missing records.
URGENCY = {
    RankState.CRASHED: 0, RankState.LOST: 1, RankState.STALLED: 2, RankState.PAUSED: 4,
    RankState.FINISHED: 5, RankState.ALIVE: 6,
}  # fmt: skip
DIVERGENT_URGENCY = 3


@dataclass(frozen=True)
class RunDigest:
    """What a summary needs of every rank of a run, from one health snapshot."""

    ranks: int
    rank_states: dict[str, int]
    by_health: dict[int, int]  # rank -> urgency, for ranks odd by their health alone
    state: str
    world_size: int
    last_time: float | None
    last_step: int | None


def digest(states: Mapping[int, RankHealth]) -> RunDigest:
    """What a summary needs of a run's ranks: from what a ``RankTable`` keeps up as its entries
    change (``RankTable.tally``), or one pass over any other mapping (``tally_of``)."""
    t = states.tally() if isinstance(states, RankTable) else tally_of(states.values())
    counts = {state.value: t.counts[state] for state in RankState if t.counts.get(state)}
    odd = {rank: URGENCY.get(h.state, 6) for rank, h in t.odd.items()}
    word = run_state_of(set(t.counts), len(states), t.world_size)
    return RunDigest(len(states), counts, odd, word, t.world_size, t.last_seen, t.last_step)


class DigestCache:
    """``digest`` of each run (and its live metric names), computed again for a new health
    snapshot of that run once ``DIGEST_EVERY_S`` passed (by the caller's clock) or that run's
    ranks came or went: beyond ``ROLLING_RANKS`` every tick brings a new snapshot (healthview.py),
    and every read of a big run asks for its digest."""

    def __init__(self) -> None:
        self._by_run: dict[str, tuple[Mapping[int, RankHealth], float, dict[str, Any]]] = {}

    def _memo(self, run: str, states: Mapping[int, RankHealth], now: float) -> dict[str, Any]:
        held = self._by_run.get(run)
        if held is None or (
            held[0] is not states
            and (len(held[0]) != len(states) or not 0 <= now - held[1] < DIGEST_EVERY_S)
        ):
            held = self._by_run[run] = (states, now, {})
        return held[2]

    def get(self, run: str, states: Mapping[int, RankHealth], now: float) -> RunDigest:
        memo = self._memo(run, states, now)
        if "digest" not in memo:
            memo["digest"] = digest(states)
        return memo["digest"]

    def metrics(
        self,
        run: str,
        states: Mapping[int, RankHealth],
        values: Mapping[tuple[str, int], Mapping[str, float]],
        now: float,
    ) -> list[str]:
        """The metric names of the ranks' latest values."""
        memo = self._memo(run, states, now)
        if "metrics" not in memo:
            memo["metrics"] = sorted({m for rank in states for m in values.get((run, rank), ())})
        return memo["metrics"]

    def odd(
        self,
        run: str,
        states: Mapping[int, RankHealth],
        now: float,
        key: Hashable,
        make: Callable[[], tuple[list[int], int]],
    ) -> tuple[list[int], int]:
        """``odd_ranks`` of the run's digest, made by ``make`` again when ``key`` (what else it
        reads: the flagged ranks, which ranks have gaps) changed: at 100,000 lost or gapped
        ranks it is a sort of them all, and every read of the run asks for it."""
        memo = self._memo(run, states, now)
        held = memo.get("odd")
        if held is None or held[0] != key:
            held = memo["odd"] = (key, make())
        listed, odd = held[1]
        return list(listed), odd

    def forget_others(self, runs: Iterable[str]) -> None:
        keep = set(runs)
        for run in [r for r in list(self._by_run) if r not in keep]:  # readers add meanwhile
            self._by_run.pop(run, None)


def odd_ranks(
    d: RunDigest,
    flagged: Iterable[int],
    gapped: Iterable[int],
    limit: int = ODD_RANKS_SHOWN,
    first: Sequence[int] = (),
) -> tuple[list[int], int]:
    """The odd ranks to list (the most urgent first, then those of ``first`` in its order, then
    by rank; at most ``limit``; listed in rank order) and how many ranks are odd in all.
    ``flagged``: ranks with an active divergence; ``gapped``: ranks missing records; ``first``:
    the ranks of the divergences a summary lists, the earliest to start first, so that in a
    cascade of every rank the card that started it is among those listed."""
    urgency = dict(d.by_health)
    for rank in flagged:
        urgency[rank] = min(urgency.get(rank, DIVERGENT_URGENCY), DIVERGENT_URGENCY)
    for rank in gapped:
        urgency.setdefault(rank, URGENCY[RankState.ALIVE])
    lead: dict[int, int] = {}  # rank -> its place in ``first``, each rank once
    for rank in first:
        lead.setdefault(rank, len(lead))
    after = len(lead)
    order = sorted(urgency, key=lambda r: (urgency[r], lead.get(r, after), r))
    return sorted(order[:limit]), len(order)


def page_ranks(ranks: Iterable[int], offset: int, limit: int) -> list[int]:
    """Ranks ``offset`` .. ``offset + limit - 1`` of the run in rank order."""
    if offset < 0 or not 0 < limit <= MAX_PAGE_RANKS:
        raise ValueError(
            f"offset must be >= 0 and limit 1..{MAX_PAGE_RANKS}, got {offset} and {limit}"
        )
    return sorted(ranks)[offset : offset + limit]


def summary_fields(d: RunDigest, odd: int, page: tuple[int, int] | None) -> dict[str, Any]:
    """The fields a summarised (or paged) run entry carries besides its listed ``ranks``."""
    out: dict[str, Any] = {
        "ranks_seen": d.ranks,
        "rank_states": d.rank_states,
        "ranks_odd": odd,
        "ranks_summarised": page is None,
    }
    if page is not None:
        out["ranks_offset"], out["ranks_limit"] = page
    return out
