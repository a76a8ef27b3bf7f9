"""An incident's one sentence (its ``summary``): who started it, how, and what followed, with
the numbers of a few ranks and the count of many. Pure; the rules give it their verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rankwatch.aggregator.health import RankHealth

if TYPE_CHECKING:
    from rankwatch.aggregator.incidents.rules import Fact

RANKS_NAMED = 4  # ranks listed by number in a summary before "N ranks"


def summary(
    cause: str,
    culprits: tuple[int, ...],
    affected: tuple[int, ...],
    terminated: tuple[int, ...],
    health: Mapping[int, RankHealth],
    basis: str,
    step: int | None,
    own: list[Fact],
    later: int | None,
) -> str:
    """The incident's one sentence. ``own``: the culprits' facts by time; ``later``: the first
    step another rank went non-finite at (a non-finite incident's)."""
    name = who(culprits, health)
    first = own[0] if own else None
    if cause == "nonfinite":
        head = f"{name} went non-finite first ({first.metric if first else '?'} at step {step})"
        tail = f"; {count(affected)} followed from step {later}" if later is not None else ""
        if basis.startswith("every rank"):
            head = f"every rank went non-finite at step {step} at once"
    elif cause == "crash":
        head = f"{name} crashed first ({first.detail if first else '?'})"
        tail = f"; {count(affected)} failed after it" if affected else ""
    elif cause == "hang":
        where = basis.split("; ")[-1] if basis.startswith("stacks") else basis
        head = f"{name} hung" + (f" after step {step}" if step is not None else "") + f" ({where})"
        tail = f"; {count(affected)} waited or timed out after it" if affected else ""
    elif cause == "lost" and basis.startswith("every rank"):
        head = (
            f"every rank ({len(culprits)}) went silent at once: the job stopped without an end "
            "event, or the network between its nodes and this head node failed"
        )
        tail = ""
    elif cause == "lost":
        head = f"{name} went silent first"
        tail = f"; {count(affected)} failed after it" if affected else ""
    elif cause == "divergence":
        head = f"{name} diverged ({first.line if first else '?'}) from step {step}"
        tail = ""
    else:
        head, tail = f"{name} is slower than the others from step {step}", ""
    if terminated:
        tail += f"; {count(terminated)} terminated by the launcher"
    return head + tail


def who(ranks: tuple[int, ...], health: Mapping[int, RankHealth]) -> str:
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        h = health.get(ranks[0])
        where = f" ({h.host}, pid {h.pid})" if h is not None and h.host else ""
        return f"rank {ranks[0]}{where}"
    if len(ranks) <= RANKS_NAMED:
        return "ranks " + ", ".join(map(str, ranks))
    return f"{len(ranks)} ranks"


def count(ranks: tuple[int, ...]) -> str:
    if len(ranks) <= RANKS_NAMED:
        word = "rank" if len(ranks) == 1 else "ranks"
        return f"{len(ranks)} {word} ({', '.join(map(str, ranks))})"
    return f"{len(ranks)} ranks"
