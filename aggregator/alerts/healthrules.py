"""The alert engine's health rules: a condition per stalled, lost or crashed rank, and the
straggler rule over the moving ranks' last steps (``AlertEngine`` is a ``HealthRules``).

In a run of more than ``FULL_PASS_RANKS`` ranks a pass looks again only at the ranks whose
state changed (``health_changed``): a pass costs what changed, not one condition per lost rank.

Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from operator import attrgetter

from rankwatch.aggregator.alerts.conds import Cond, Conds, cond_key
from rankwatch.aggregator.alerts.config import AlertConfig
from rankwatch.aggregator.divergence.detector import Divergence, DivergenceConfig, step_lag
from rankwatch.aggregator.health import RankHealth, RankState, run_state

HEALTH_RULES = {RankState.STALLED: "stalled", RankState.LOST: "lost", RankState.CRASHED: "crashed"}
LIVE_RULES = (*HEALTH_RULES.values(), "straggler")  # the conditions the health snapshot sets
# A run of at most this many ranks has its health conditions built again on every pass (their
# words, "no record for 12 s", stay current); a bigger one only for the ranks that changed.
FULL_PASS_RANKS = 4096


class HealthRules:
    """The health rules' part of the alert engine's state and passes."""

    config: AlertConfig
    divergence: DivergenceConfig
    _conds: Conds
    _health_of: dict[str, dict[int, str]]  # run -> rank -> its health rule
    _finished: set[str]  # runs finished in the last snapshot
    # run -> (rank -> its last step if moving, else None; the moving ranks' last steps)
    _steps_of: dict[str, tuple[dict[int, int | None], dict[int, int]]]

    # AlertEngine's own: every rule sets its conditions through one place
    def _set(self, cond: Cond, before: Mapping[str, Cond] | None = None) -> None:
        raise NotImplementedError

    def _from_divergence(self, rule: str, d: Divergence, now: float) -> Cond:
        raise NotImplementedError

    def _drop_finished(self) -> None:
        """A finished run has nothing left to alert about."""
        for run in self._finished:
            self._conds.drop_groups(self._conds.groups(run=run))
            self._health_of.pop(run, None)

    def _health(
        self,
        health: Mapping[str, Mapping[int, RankHealth]],
        now: float,
        changed: Collection[tuple[str, int]] | None,
        evaluated: Collection[tuple[str, int]] | None,
    ) -> None:
        self._finished &= health.keys()
        gone = [g for g in self._conds.groups(LIVE_RULES) if g[1] not in health]
        self._conds.drop_groups(gone)  # runs no longer in the snapshot
        for run in [r for r in self._health_of if r not in health]:
            del self._health_of[run]
        touched: dict[str, list[int]] = {}
        for run, rank in changed if changed is not None else ():
            touched.setdefault(run, []).append(rank)
        stepped: dict[str, list[int]] = {}
        for run, rank in evaluated if evaluated is not None else ():
            stepped.setdefault(run, []).append(rank)
        for run, ranks in health.items():
            full = changed is None or len(ranks) <= FULL_PASS_RANKS
            if self._run_finished(run, ranks, None if full else touched.get(run, [])):
                self._finished.add(run)
                continue
            self._finished.discard(run)
            if full:
                self._rank_rules(run, ranks, list(ranks))
            elif run in touched:
                self._rank_rules(run, ranks, touched[run])
            if full or evaluated is None:
                self._stragglers(run, ranks, now, None)
            else:
                self._stragglers(run, ranks, now, stepped.get(run, []) + touched.get(run, []))
        for run in [r for r in self._steps_of if r not in health]:
            del self._steps_of[run]
        self._drop_finished()

    def _run_finished(
        self, run: str, ranks: Mapping[int, RankHealth], changed: list[int] | None
    ) -> bool:
        """Is ``run`` finished? Asked of every rank only when one that changed (``changed``;
        None: any) finished, or the run was finished: most passes of a big run ask no rank."""
        if changed is not None and run not in self._finished:
            finished = RankState.FINISHED
            if not any(h.state is finished for r in changed if (h := ranks.get(r)) is not None):
                return False
        return run_state(ranks.values()) == "finished"

    def _rank_rules(self, run: str, ranks: Mapping[int, RankHealth], which: list[int]) -> None:
        """The conditions of ``which`` ranks of ``run`` from their health (or their absence)."""
        held = self._health_of.setdefault(run, {})
        for rank in which:
            h = ranks.get(rank)
            rule = HEALTH_RULES.get(h.state) if h is not None else None
            was = held.get(rank)
            if was is not None and was != rule:
                self._conds.pop(cond_key(was, run, rank, None))
                del held[rank]
            if rule is None or h is None:
                continue
            msg = f"rank {rank} ({h.host or 'unknown host'}) {h.message}"
            cond = Cond(rule, run, rank, None, h.last_step, h.since, None, msg,
                         self.config.severity_of(rule))  # fmt: skip
            self._set(cond)
            if self.config.enabled(rule):
                held[rank] = rule
        if len(which) == len(ranks):  # every rank looked at: forget those no longer listed
            for rank in [r for r in held if r not in ranks]:
                self._conds.pop(cond_key(held.pop(rank), run, rank, None))

    def _stragglers(
        self, run: str, ranks: Mapping[int, RankHealth], now: float, which: list[int] | None
    ) -> None:
        """The straggler rule over the moving ranks' last steps, kept by ``which`` ranks (those
        evaluated again since the last pass; None: every rank's looked at)."""
        steps = self._moving_steps(run, ranks, which)
        before = dict(self._conds.group(("straggler", run, "step")))
        for key in before:
            self._conds.pop(key)
        lagging = step_lag(run, steps, self.divergence)
        for d in sorted(lagging, key=_RANK) if which is not None else lagging:
            self._set(self._from_divergence("straggler", d, now), before)

    def _moving_steps(
        self, run: str, ranks: Mapping[int, RankHealth], which: list[int] | None
    ) -> dict[int, int]:
        """The last step of ``run``'s moving ranks, updated in ``which`` ranks; built again
        from every rank when ranks came or went unseen."""
        kept = self._steps_of.get(run)
        if kept is not None and which is not None:
            every, moving = kept
            for rank in which:
                h = ranks.get(rank)
                step = _moving_step(h) if h is not None else None
                if h is None:
                    every.pop(rank, None)
                else:
                    every[rank] = step
                if step is None:
                    moving.pop(rank, None)
                else:
                    moving[rank] = step
            if len(every) == len(ranks):
                return moving
        every = {rank: _moving_step(h) for rank, h in ranks.items()}
        moving = {rank: step for rank, step in every.items() if step is not None}
        self._steps_of[run] = (every, moving)
        return moving


_MOVING = (RankState.ALIVE, RankState.STALLED)
_RANK = attrgetter("rank")


def _moving_step(h: RankHealth) -> int | None:
    return h.last_step if h.state in _MOVING else None
