"""Policies: which incidents lead to which actions. Pure: data in, decisions out.

In the TOML config (``rankwatch serve --config``)::

    [[policy]]
    name = "stop-on-nan"
    on = "nonfinite"                  # incident cause(s): nonfinite divergence hang crash ...
    actions = ["checkpoint", "stop"]  # notify, note, checkpoint, stop (in this order)

    [[policy]]
    name = "long-divergence"
    on = "divergence"
    after_steps = 1000                # once the incident has lasted this many steps
    actions = ["checkpoint", "stop"]

or on the command line, ``--policy CAUSE[@STEPS]:ACTION[+ACTION...]``
(``nonfinite:checkpoint+stop``, ``divergence@200:notify``) or a preset name (``PRESETS``).
Without any policy nothing is sent to the ranks: incidents are told (console, webhooks, page),
as before. A rule fires once per incident; ``notify`` records the decision and says it on the
console, ``note`` writes ``text`` in every rank's log, ``checkpoint`` and ``stop`` go to every
rank of the run at one agreed step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rankwatch.aggregator.incidents.model import CAUSES

ACTIONS = ("notify", "note", "checkpoint", "stop")
MAX_FIRED = 65_536  # (rule, incident) pairs remembered, to fire each once
RULE_KEYS = ("name", "on", "actions", "after_steps", "text")
PRESETS: dict[str, tuple[str, ...]] = {
    "notify": (),  # the default: nothing sent to the ranks
    "stop-on-nan": ("nonfinite:checkpoint+stop",),
    "checkpoint-on-nan": ("nonfinite:checkpoint",),
    "stop-on-crash": ("crash:stop",),
}
_SPEC = re.compile(r"(?P<on>[a-z,]+)(?:@(?P<steps>\d+))?:(?P<actions>[a-z+]+)")


class PolicyError(ValueError):
    """A policy that cannot be used; the message names where and what."""


@dataclass(frozen=True)
class Rule:
    name: str
    causes: frozenset[str]
    actions: tuple[str, ...]
    after_steps: int = 0
    text: str = ""

    def describe(self) -> str:
        when = f" lasting {self.after_steps} steps" if self.after_steps else ""
        causes, actions = "/".join(sorted(self.causes)), ", then ".join(self.actions)
        return f"on a {causes} incident{when}: {actions}"


@dataclass(frozen=True)
class Case:
    """What a rule looks at in an incident (``Incident`` or its stored dict)."""

    id: str
    run: str
    cause: str
    step: int | None
    firing: bool
    summary: str = ""
    culprits: tuple[int, ...] = ()

    @classmethod
    def of(cls, incident: Any) -> Case:
        get = incident.get if isinstance(incident, Mapping) else lambda k: getattr(incident, k)
        step = get("step")
        return cls(str(get("id")), str(get("run")), str(get("cause")),
                   step if type(step) is int else None, get("state") == "firing",
                   str(get("summary") or ""), tuple(get("culprits") or ()))  # fmt: skip


@dataclass(frozen=True)
class Decision:
    rule: Rule
    case: Case
    at_step: int | None  # the run's highest reported step when it fired

    @property
    def by(self) -> str:
        return f"policy:{self.rule.name}"

    @property
    def reason(self) -> str:
        culprit = ",".join(map(str, self.case.culprits)) or "?"
        return f"{self.case.cause} incident {self.case.id} (culprit rank {culprit}): " + (
            self.case.summary[:300] or self.rule.describe()
        )


def parse_rules(raw: Any, where: str) -> tuple[Rule, ...]:
    """``[[policy]]`` tables (a list of maps) as rules; PolicyError names the problem."""
    if not isinstance(raw, list) or not all(isinstance(item, Mapping) for item in raw):
        raise PolicyError(f"{where}: [[policy]] must be tables (a list of maps)")
    rules = [parse_rule(item, f"{where}: policy {i + 1}") for i, item in enumerate(raw)]
    names = [r.name for r in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PolicyError(f"{where}: policy name(s) used twice: {', '.join(twice)}")
    return tuple(rules)


def parse_rule(raw: Mapping[str, Any], where: str) -> Rule:
    unknown = sorted(set(raw) - set(RULE_KEYS))
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {RULE_KEYS}")
    on = raw.get("on")
    causes = [on] if isinstance(on, str) else on
    if not isinstance(causes, list) or not causes or not all(isinstance(c, str) for c in causes):
        raise PolicyError(f"{where}: 'on' must be a cause or a list of them: {', '.join(CAUSES)}")
    bad = sorted(set(causes) - set(CAUSES))
    if bad:
        raise PolicyError(f"{where}: unknown cause(s) {', '.join(bad)}; known: {', '.join(CAUSES)}")
    actions = raw.get("actions", ["notify"])
    actions = [actions] if isinstance(actions, str) else actions
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
        raise PolicyError(f"{where}: 'actions' must be a list of {', '.join(ACTIONS)}")
    bad = sorted(set(actions) - set(ACTIONS))
    if bad:
        raise PolicyError(f"{where}: unknown action(s) {', '.join(bad)}; known: {ACTIONS}")
    if len(set(actions)) != len(actions):
        raise PolicyError(f"{where}: an action is named twice in {actions}")
    order = [ACTIONS.index(a) for a in actions]
    if order != sorted(order):  # a stop before its checkpoint would leave nothing to save
        raise PolicyError(f"{where}: actions go in the order {', '.join(ACTIONS)}: {actions}")
    after = raw.get("after_steps", 0)
    if type(after) is not int or after < 0:
        raise PolicyError(f"{where}: 'after_steps' must be an integer >= 0, got {after!r}")
    text = raw.get("text", "")
    if not isinstance(text, str) or len(text) > 400:
        raise PolicyError(f"{where}: 'text' must be a string of at most 400 characters")
    name = raw.get("name") or f"{'+'.join(causes)}{f'@{after}' if after else ''}"
    if not isinstance(name, str) or not re.fullmatch(r"[0-9A-Za-z_.@+-]{1,64}", name):
        raise PolicyError(f"{where}: 'name' must be 1-64 of [0-9A-Za-z_.@+-], got {name!r}")
    return Rule(name, frozenset(causes), tuple(actions), after, text)


def parse_spec(spec: str, where: str = "--policy") -> tuple[Rule, ...]:
    """``--policy`` text: a preset name or ``CAUSE[,CAUSE][@STEPS]:ACTION[+ACTION]``."""
    spec = spec.strip()
    if spec in PRESETS:
        return tuple(parse_spec(s, where)[0] for s in PRESETS[spec])
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise PolicyError(
            f"{where} {spec!r}: expected a preset ({', '.join(PRESETS)}) or "
            "CAUSE[@STEPS]:ACTION[+ACTION], like nonfinite:checkpoint+stop"
        )
    raw = {"on": match["on"].split(","), "actions": match["actions"].split("+")}
    if match["steps"]:
        raw["after_steps"] = int(match["steps"])
    return (parse_rule(raw, f"{where} {spec!r}"),)


class PolicyEngine:
    """Decides, once per (rule, incident), what the rules say about the firing incidents."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules = tuple(rules)
        self._fired: dict[tuple[str, str], None] = {}

    def decide(self, cases: Iterable[Case], highest: Mapping[str, int | None]) -> list[Decision]:
        """``highest``: each run's highest step any rank reported."""
        out: list[Decision] = []
        if not self.rules:
            return out
        for case in cases:
            if not case.firing:
                continue
            top = highest.get(case.run)
            for rule in self.rules:
                key = (rule.name, case.id)
                if case.cause not in rule.causes or key in self._fired:
                    continue
                if rule.after_steps and (
                    case.step is None or top is None or top - case.step < rule.after_steps
                ):
                    continue
                self._fired[key] = None
                if len(self._fired) > MAX_FIRED:
                    del self._fired[next(iter(self._fired))]
                out.append(Decision(rule, case, top))
        return out
