"""Alert rules over divergence results and rank health; alerts are values that explain themselves.

Pure: ``now`` is passed in. ``AlertEngine.evaluate`` keeps a set of *conditions* (one per rule,
run, rank, metric) and returns only transitions: an alert that starts firing, or one that
resolves. When more than ``group_ranks`` ranks of one run trip the same rule on the same metric
(all ranks lost when the head node's network drops, NaN everywhere), they are published as one
run-level alert (``rank=None``) instead of thousands, and only the groups that changed are
published again (``conds.py``). The health rules look again only at the ranks whose state
changed (``health_changed``) in a run of more than ``FULL_PASS_RANKS`` ranks: a pass costs what
changed, not one condition per lost rank.

An Alert's words for people (its one line, a message's title) are the sinks' part:
``sinks/words.py``, which reads Alerts and their dict form alike.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rankwatch.aggregator.alerts.conds import (
    GROUP_LISTED,
    Conds,
    Group,
    cond_key,
    divergence_cond,
    group_words,
    key_words,
)
from rankwatch.aggregator.alerts.conds import Cond as _Cond
from rankwatch.aggregator.alerts.config import (
    OPS,
    AlertConfig,
    PlateauRule,
    ThresholdRule,
    ThroughputRule,
)
from rankwatch.aggregator.alerts.grouping import RankedGroup
from rankwatch.aggregator.alerts.healthrules import FULL_PASS_RANKS, HealthRules
from rankwatch.aggregator.divergence.detector import (
    Divergence,
    DivergenceConfig,
    QuietSteps,
    StepResult,
    StepStats,
)
from rankwatch.aggregator.health import RankHealth
from rankwatch.aggregator.telemetry.metrics import RULES as HARDWARE_RULES
from rankwatch.aggregator.telemetry.outliers import Finding

__all__ = ["FULL_PASS_RANKS", "Alert", "AlertEngine"]


@dataclass(frozen=True)
class Alert:
    key: str  # rule|run|rank|metric ("*" for a run-level group, "" for none)
    rule: str
    severity: str  # info | warning | critical
    state: str  # firing | resolved
    run: str
    rank: int | None  # None: about the run (or a group of ranks)
    metric: str | None
    since_step: int | None
    since_time: float  # when the condition began (aggregator clock)
    time: float  # when this transition happened
    value: float | None
    message: str
    ranks: tuple[int, ...] = ()  # the ranks involved, for a grouped alert


class _Series:
    """Per (run, metric) memory of the step-based rules."""

    def __init__(self, run: str, metric: str) -> None:
        self.run, self.metric = run, metric
        self._keys: dict[tuple[str, str], str] = {}
        self.threshold_run: dict[int, int] = {}  # threshold index -> consecutive steps true
        self.smooth: float | None = None
        self.best: float | None = None
        self.best_step: int | None = None
        self.baseline: deque[float] = deque()
        self.low_run = 0

    def key(self, rule: str, metric: str) -> str:
        """``_Cond.key`` of this run's run-level condition (made once: it is asked per step)."""
        key = self._keys.get((rule, metric))
        if key is None:
            key = self._keys[(rule, metric)] = cond_key(rule, self.run, None, metric)
        return key


def _threshold_cond(
    rule: ThresholdRule, s: StepStats, value: float, metric_key: str, now: float
) -> _Cond:
    what = "median" if rule.on == "median" else ("max" if ">" in rule.op else "min")
    msg = (
        f"{s.metric} {what} across {s.n} ranks is {value:.4g}, {rule.op} {rule.value:g}"
        f" (step {s.step})"
    )
    since = s.step - rule.steps + 1
    return _Cond("threshold", s.run, None, metric_key, since, now, value, msg, rule.severity)


def _plateau_cond(
    rule: PlateauRule, s: StepStats, best: float, best_step: int, level: float, stuck: int,
    now: float, severity: str,
) -> _Cond:  # fmt: skip
    sign = 1.0 if rule.mode == "min" else -1.0
    msg = (
        f"{s.metric} (median of {s.n} ranks, smoothed) has not improved by "
        f"{rule.min_improvement:.0%} for {stuck} steps: best {sign * best:.4g} at "
        f"step {best_step}, now {sign * level:.4g}"
    )
    return _Cond("plateau", s.run, None, s.metric, best_step, now, s.median, msg, severity)


def _throughput_cond(s: StepStats, baseline: float, since: int, now: float, severity: str) -> _Cond:
    msg = (
        f"median {s.metric} of {s.n} ranks fell to {s.median:.4g}, "
        f"{s.median / baseline:.0%} of its recent {baseline:.4g} (step {s.step})"
    )
    return _Cond("throughput_drop", s.run, None, s.metric, since, now, s.median, msg, severity)


class AlertEngine(HealthRules):
    def __init__(
        self, config: AlertConfig | None = None, divergence: DivergenceConfig | None = None
    ):
        self.config = config or AlertConfig()
        self.divergence = divergence or DivergenceConfig()
        self._conds = Conds()
        self._pub_groups: dict[Group, set[str]] = {}  # the published keys of each group
        self._health_of: dict[str, dict[int, str]] = {}  # run -> rank -> its health rule
        self._series: dict[tuple[str, str], _Series] = {}
        # conditions the step rules set, built when evaluate settles them (_defer)
        self._pending: dict[str, tuple[int | None, Callable[..., _Cond], tuple[Any, ...]]] = {}
        self._published: dict[str, Alert] = {}
        self._history: deque[Alert] = deque(maxlen=self.config.history_size)
        self._health_seen: Mapping[str, Mapping[int, RankHealth]] | None = None
        self._finished: set[str] = set()  # runs finished in that snapshot
        self._steps_of = {}

    def evaluate(
        self,
        now: float,
        *,
        results: Iterable[StepResult | QuietSteps] = (),
        health: Mapping[str, Mapping[int, RankHealth]] | None = None,
        hardware: Sequence[Finding] | None = None,
        health_changed: Collection[tuple[str, int]] | None = None,
        health_evaluated: Collection[tuple[str, int]] | None = None,
    ) -> list[Alert]:
        """Update the conditions; return the alerts that started firing or resolved.
        ``hardware``: every hardware condition that holds now (``telemetry.outliers``); the
        hardware rules' conditions are replaced by them (None: left as they are).
        ``health_changed``: the (run, rank) whose state may differ from the last ``health``
        given (None: any rank's); a run of more than ``FULL_PASS_RANKS`` ranks is looked at
        again only in those. ``health_evaluated``: the (run, rank) evaluated again since then,
        whose last step may have moved (None: any rank's); the straggler rule of such a run
        updates only those ranks' steps."""
        for res in results:
            if isinstance(res, QuietSteps):  # nothing flagged or resolved: only the step rules
                if self._watched(res.metric):
                    self._step_rules(res.stats(), now)
                continue
            self._divergences(res, now)
            self._step_rules((res.stats,), now)
        self._settle()  # before health: a finished run drops every condition it has
        if hardware is not None:
            self._hardware(hardware)
        if health is not None:
            if health is self._health_seen:
                # the same snapshot as the last tick's (health is evaluated again at most once
                # a second, or after a state-changing record): its conditions hold as they are
                self._drop_finished()
            else:
                self._health(health, now, health_changed, health_evaluated)
                self._health_seen = health
        return self._publish(now)

    def firing(self) -> list[Alert]:
        return sorted(self._published.values(), key=lambda a: (a.since_time, a.key))

    def history(self, limit: int = 100) -> list[Alert]:
        """The latest transitions, newest first."""
        return list(self._history)[::-1][: max(0, limit)]

    # --- condition sources -----------------------------------------------------------------

    def _set(self, cond: _Cond, before: Mapping[str, _Cond] | None = None) -> None:
        if self.config.enabled(cond.rule):
            key = cond.key
            old = self._conds.get(key) or (before or {}).get(key)
            # Keep when it began: a condition that persists is one condition.
            if old is not None:
                cond = cond._replace(since_step=old.since_step, since_time=old.since_time)
            self._conds.put(cond, key)

    def _clear(self, rule: str, run: str, rank: int | None, metric: str | None) -> None:
        self._drop(cond_key(rule, run, rank, metric))

    def _drop(self, key: str) -> None:
        self._conds.pop(key)
        self._pending.pop(key, None)

    def _divergences(self, res: StepResult, now: float) -> None:
        """A scored step's new divergences as conditions, a group's at once (``_set`` of each
        in turn, the same conditions after: a cascade's step is every rank's). What a group's
        conditions share (the rule's severity, the key's words) is made once per group."""
        # group -> (key -> its new cond, the key's words before and after the rank, severity)
        made: dict[Group, tuple[dict[str, _Cond], str, str, str]] = {}
        enabled = {r for r in ("nonfinite", "divergence") if self.config.enabled(r)}
        held = self._conds.get
        for d in res.new:
            rule = "nonfinite" if d.kind == "nonfinite" else "divergence"
            group: Group = (rule, d.run, d.metric)
            mine = made.get(group)
            if mine is None:
                if rule not in enabled:
                    continue
                mine = made[group] = ({}, *key_words(*group), self.config.severity_of(rule))
            conds, head, tail, severity = mine
            key = f"{head}{d.rank}{tail}"
            old = conds.get(key) or held(key)
            since_step, since_time = (
                (d.since_step, now) if old is None else (old.since_step, old.since_time)
            )  # it persists: one condition, since it began
            conds[key] = divergence_cond(rule, d, since_step, since_time, severity)
        for group, (conds, *_) in made.items():
            self._conds.put_many(group, conds)
        for d in res.resolved:
            self._clear(
                "nonfinite" if d.kind == "nonfinite" else "divergence", d.run, d.rank, d.metric
            )

    def _from_divergence(self, rule: str, d: Divergence, now: float) -> _Cond:
        return divergence_cond(rule, d, d.since_step, now, self.config.severity_of(rule))

    def _watched(self, metric: str) -> bool:
        """A step rule reads this metric's statistics."""
        cfg = self.config
        return (
            any(rule.metric == metric for rule in cfg.thresholds)
            or (cfg.plateau is not None and cfg.plateau.metric == metric)
            or (cfg.throughput_drop is not None and cfg.throughput_drop.metric == metric)
        )

    def _step_rules(self, stats: Sequence[StepStats], now: float) -> None:
        """The step rules over consecutive steps of one (run, metric), in step order."""
        cfg = self.config
        run, metric = stats[0].run, stats[0].metric
        series = self._series.get((run, metric))
        if series is None:
            series = self._series[(run, metric)] = _Series(run, metric)
        live = [s for s in stats if math.isfinite(s.median)]
        if not live:
            return
        thresholds = [(i, rule) for i, rule in enumerate(cfg.thresholds) if rule.metric == metric]
        if thresholds:
            self._thresholds(thresholds, live, series, now)
        if cfg.plateau is not None and cfg.plateau.metric == metric:
            self._plateau(cfg.plateau, live, series, now)
        if cfg.throughput_drop is not None and cfg.throughput_drop.metric == metric:
            self._throughput(cfg.throughput_drop, live, series, now)

    def _defer(self, key: str, since: int | None, build: Callable[..., _Cond], *args: Any) -> None:
        """Set condition ``key`` (``build(*args)``) when ``evaluate`` settles: a rule firing on
        every step of a batch builds its words once, from the last step. It began at the first
        (or earlier: ``_set`` keeps the start of one that was already set)."""
        pending = self._pending.get(key)
        self._pending[key] = (since if pending is None else pending[0], build, args)

    def _settle(self) -> None:
        for since, build, args in self._pending.values():
            cond = build(*args)
            self._set(cond if cond.since_step == since else cond._replace(since_step=since))
        self._pending.clear()

    def _thresholds(
        self,
        rules: list[tuple[int, ThresholdRule]],
        stats: list[StepStats],
        series: _Series,
        now: float,
    ) -> None:
        runs = series.threshold_run
        keyed = []
        for i, rule in rules:
            metric_key = f"{series.metric}{rule.op}{rule.value:g}"
            keyed.append((i, rule, metric_key, series.key("threshold", metric_key)))
        for s in stats:
            for i, rule, metric_key, key in keyed:
                value = s.median
                if rule.on == "any":
                    value = s.max if rule.op.startswith(">") else s.min
                if OPS[rule.op](value, rule.value):
                    runs[i] = runs.get(i, 0) + 1
                    if runs[i] >= rule.steps:
                        since = s.step - rule.steps + 1
                        self._defer(key, since, _threshold_cond, rule, s, value, metric_key, now)
                else:
                    runs[i] = 0
                    self._drop(key)

    def _plateau(
        self, rule: PlateauRule, stats: list[StepStats], series: _Series, now: float
    ) -> None:
        sign = 1.0 if rule.mode == "min" else -1.0
        key = series.key("plateau", series.metric)
        for s in stats:
            x = sign * s.median
            series.smooth = (
                x if series.smooth is None else series.smooth + rule.smoothing * (x - series.smooth)
            )
            level = series.smooth
            if series.best is None or level < series.best - rule.min_improvement * abs(series.best):
                series.best, series.best_step = level, s.step
                self._drop(key)
                continue
            assert series.best_step is not None
            stuck = s.step - series.best_step
            if stuck >= rule.steps:
                severity = self.config.severity_of("plateau")
                self._defer(
                    key, series.best_step, _plateau_cond, rule, s, series.best, series.best_step,
                    level, stuck, now, severity,
                )  # fmt: skip

    def _throughput(
        self, rule: ThroughputRule, stats: list[StepStats], series: _Series, now: float
    ) -> None:
        base = series.baseline
        key = series.key("throughput_drop", series.metric)
        for s in stats:
            if len(base) >= rule.min_baseline_steps:
                baseline = sorted(base)[len(base) // 2]
                if s.median < rule.fraction * baseline:
                    series.low_run += 1
                    if series.low_run >= rule.confirm_steps:
                        since = s.step - series.low_run + 1
                        severity = self.config.severity_of("throughput_drop")
                        self._defer(key, since, _throughput_cond, s, baseline, since, now, severity)
                    continue  # a dropped step must not drag the baseline down with it
                series.low_run = 0
                self._drop(key)
            base.append(s.median)
            while len(base) > rule.baseline_steps:
                base.popleft()

    def _hardware(self, findings: Sequence[Finding]) -> None:
        before = {k: c for g in self._conds.groups(HARDWARE_RULES)
                  for k, c in self._conds.group(g).items()}  # fmt: skip
        for key in before:
            self._conds.pop(key)
        for f in findings:
            sev = self.config.severity_of(f.rule)
            cond = _Cond(f.rule, f.run, f.rank, f.metric, None, f.since_time, f.value, f.message,
                         sev)  # fmt: skip
            self._set(cond, before)

    # --- publishing ------------------------------------------------------------------------

    def _publish(self, now: float) -> list[Alert]:
        """The groups that changed, published again: their new and resolved alerts."""
        out: list[Alert] = []
        resolved: list[Alert] = []
        for group in self._conds.take_dirty():
            wanted = self._wanted(group, now)
            for key, alert in wanted.items():
                old = self._published.get(key)
                if old is None:
                    out.append(alert)
                    self._published[key] = alert
                else:  # still firing: keep its first time, refresh the words
                    self._published[key] = replace(alert, time=old.time)
            for key in self._pub_groups.pop(group, set()) - wanted.keys():
                old = self._published.pop(key)
                resolved.append(replace(old, state="resolved", time=now,
                                        message=f"resolved: {old.message}"))  # fmt: skip
            if wanted:
                self._pub_groups[group] = set(wanted)
        out += resolved
        self._history.extend(out)
        return out

    def _wanted(self, group: Group, now: float) -> dict[str, Alert]:
        """The alerts one group's conditions make now."""
        wanted: dict[str, Alert] = {}
        ranked = self._conds.ranked(group)
        if ranked is not None and len(ranked) > self.config.group_ranks:
            alert = _group_alert(*group, ranked, now)
            wanted[alert.key] = alert
            run_level = self._conds.get(cond_key(group[0], group[1], None, group[2]))
            conds = [] if run_level is None else [run_level]
        else:
            conds = list(self._conds.group(group).values())
        for c in conds:
            wanted[c.key] = Alert(
                c.key, c.rule, c.severity, "firing", c.run, c.rank, c.metric, c.since_step,
                c.since_time, now, c.value, c.message,
            )  # fmt: skip
        return wanted


def _group_alert(rule: str, run: str, metric: str | None, group: RankedGroup, now: float) -> Alert:
    """One alert for many ranks' conditions, from what ``RankedGroup`` keeps up to date: a pass
    costs the ranks that changed, not the group's size."""
    ranks = group.ranks()
    first = [group.by_rank[r] for r in ranks[:GROUP_LISTED]]
    since_time = group.since_time()
    assert since_time is not None  # a group with ranks
    return Alert(
        f"{rule}|{run}|*|{metric or ''}", rule, group.severity(), "firing", run, None, metric,
        group.since_step(), since_time, now, first[0].value, group_words(rule, first, ranks),
        ranks,
    )  # fmt: skip
