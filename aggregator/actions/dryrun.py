"""What a policy would have done on a stored run (``rankwatch policy test``): pure.

Each stored incident is replayed against the rules with the run's progress (the highest step
any rank had reported by each time): a rule fires when the incident opened (``after_steps``
0) or at the first time the run had gone ``after_steps`` past the incident's step while it was
still firing. Its checkpoint and stop would have come at ``agree.stop_step`` of the step then
reached, so the steps the run trained after that are the steps a stop would have saved.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankwatch.aggregator.actions.agree import stop_step
from rankwatch.aggregator.actions.policy import Case, Rule


@dataclass(frozen=True)
class WouldDo:
    rule: Rule
    case: Case
    time: float  # when it would have fired
    at_step: int | None  # the highest step reported then
    act_step: int | None  # the step its checkpoint / stop would have named
    last_step: int | None  # the run's last step

    @property
    def saved(self) -> int:
        """Steps trained after the stop this would have made (0 without a stop)."""
        if "stop" not in self.rule.actions or self.act_step is None or self.last_step is None:
            return 0
        return max(0, self.last_step - self.act_step)

    def line(self) -> str:
        culprit = ",".join(map(str, self.case.culprits)) or "?"
        head = (f"{self.case.cause} incident {self.case.id} (culprit rank {culprit}, from step "
                f"{self.case.step}): policy {self.rule.name} would ")  # fmt: skip
        sent = [a for a in self.rule.actions if a != "notify"]
        words = ["notify"] if "notify" in self.rule.actions else []
        if sent:
            where = f" every rank at the end of step {self.act_step}" if self.act_step else ""
            words.append(", then ".join(sent) + where)
        tail = f" (decided at step {self.at_step})"
        if self.saved:
            tail += f": {self.saved} steps before the run's last step {self.last_step}"
        return head + "; ".join(words) + tail


def progress(steps: Iterable[tuple[float, int]]) -> tuple[list[float], list[int]]:
    """(time, step) pairs -> times sorted and the highest step reached by each."""
    times: list[float] = []
    highest: list[int] = []
    top: int | None = None
    for t, s in sorted(steps):
        top = s if top is None else max(top, s)
        times.append(t)
        highest.append(top)
    return times, highest


def dry_run(
    rules: Sequence[Rule],
    incidents: Iterable[Mapping[str, Any]],
    steps: Iterable[tuple[float, int]],
    step_time_s: float | None,
) -> list[WouldDo]:
    times, highest = progress(steps)
    last = highest[-1] if highest else None
    out: list[WouldDo] = []
    for body in incidents:
        case = Case.of(body)
        opened = float(body.get("opened") or 0.0)
        resolved = body.get("resolved")
        end = float(resolved) if isinstance(resolved, (int, float)) else float("inf")
        for rule in rules:
            if case.cause not in rule.causes:
                continue
            when = _fires(rule, case, opened, end, times, highest)
            if when is None:
                continue
            i = bisect.bisect_right(times, when) - 1
            at = highest[i] if i >= 0 else None
            sent = [a for a in rule.actions if a in ("checkpoint", "stop")]
            act = stop_step([at], step_time_s) if sent else None
            out.append(WouldDo(rule, case, when, at, act, last))
    return sorted(out, key=lambda w: w.time)


def _fires(
    rule: Rule, case: Case, opened: float, end: float, times: list[float], highest: list[int]
) -> float | None:
    if not rule.after_steps:
        return opened
    if case.step is None:
        return None
    goal = case.step + rule.after_steps
    i = bisect.bisect_left(times, opened)
    j = bisect.bisect_left(highest, goal, lo=i)  # highest is sorted: it never goes down
    if j >= len(times) or times[j] > end:
        return None
    return times[j]
