"""The rank table of a run of any size, one page at a time, and its node map. Pure.

A page of 100,000 ranks cannot hold every rank's row, nor draw a heatmap row per rank: the
server sorts, filters and pages the table (``select``) and folds the ranks into one cell per
node (``node_cells``), each cell as bad as its worst rank. Both start from the same rows
(``rows_of``): the snapshot's rank entries, with the run's latest values and z where the entries
carry none (a stored run), and each rank's part in the run's incident.

How much a rank asks for a person's attention is one number, ``level`` (``LEVELS`` names
them, worst last): the table lists the ranks above "ok" first by default, and the node map
colours a node by its worst rank's level.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_FILTER_CHARS = 200
MAX_NODE_CELLS = 16_384  # past this many hosts the map folds ranks into blocks instead
MIN_BLOCK_RANKS = 8  # a block of the map is at least one node's worth of ranks
FAR_Z = 3.0  # |z| from which an unflagged rank is shown a shade darker ("far")
MAX_DIVERGENT_LISTED = 64  # flagged ranks named in every answer, whatever the page shows

# Worst last: a node takes the colour of its worst rank.
LEVELS = ("ok", "far", "stalled", "affected", "flagged", "crashed", "culprit")
_LEVEL = {name: i for i, name in enumerate(LEVELS)}
STALLED_STATES = frozenset({"stalled", "lost"})
ROLES = ("culprit", "affected", "terminated")
_ROLE_KEYS = {"culprit": "culprits", "affected": "affected", "terminated": "terminated"}

# sort key -> its natural direction (True: largest first); `desc` given turns it around
SORTS = {
    "attention": True,  # worst level first, then rank
    "rank": False,
    "state": False,
    "last_step": False,
    "value": False,
    "z": True,  # furthest from the others first, either side
    "host": False,
}
FILTER_WORDS = {"odd", "flagged", *ROLES}  # besides a state name, a rank range or host text
RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")

Row = dict[str, Any]


@dataclass(frozen=True)
class Query:
    sort: str = "attention"
    desc: bool = True
    page: int = 1
    size: int = DEFAULT_PAGE_SIZE
    filter: str = ""
    host: str | None = None


def parse_query(
    sort: str | None = None,
    desc: str | None = None,
    page: str | None = None,
    size: str | None = None,
    filter: str | None = None,
    host: str | None = None,
) -> Query:
    """The table query from its text parameters; ValueError says what is wrong with one."""
    key = (sort or "attention").strip()
    if key not in SORTS:
        raise ValueError(f"sort: {key[:40]!r} is not one of {', '.join(SORTS)}")
    if desc is None or desc == "":
        down = SORTS[key]
    elif desc.strip().lower() in ("1", "true", "yes"):
        down = True
    elif desc.strip().lower() in ("0", "false", "no"):
        down = False
    else:
        raise ValueError(f"desc: {desc[:20]!r} is not 1 or 0")
    number = _whole("page", page, 1, 1, 10**9)
    count = _whole("size", size, DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    text = (filter or "").strip()
    if len(text) > MAX_FILTER_CHARS:
        raise ValueError(f"filter: at most {MAX_FILTER_CHARS} characters")
    if (m := RANGE.match(text)) and m.group(2) and int(m.group(2)) < int(m.group(1)):
        raise ValueError(f"filter: the rank range {text!r} ends before it starts")
    return Query(key, down, number, count, text, host if host else None)


def _whole(name: str, text: str | None, default: int, lo: int, hi: int) -> int:
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{name}: {text[:20]!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name}: {value} is not between {lo} and {hi:,}")
    return value


def _number(value: Any) -> float | None:
    """A finite or non-finite float; None for anything else (missing, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value in ("NaN", "Infinity", "-Infinity"):  # the wire's spelling (jsonenc)
            return float(value.replace("Infinity", "inf"))
        return None
    return float(value)


def roles_of(incidents: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """rank -> its part (culprit, affected, terminated) in the run's incident that matters
    now: the newest firing one, else the newest (the list is newest first); culprits first."""
    if not incidents:
        return {}
    firing = [i for i in incidents if i.get("state") == "firing"]
    incident = (firing or list(incidents))[0]
    out: dict[int, str] = {}
    for role in ROLES:  # culprits first; one that was also terminated stays the culprit
        for rank in incident.get(_ROLE_KEYS[role]) or ():
            if isinstance(rank, int):
                out.setdefault(rank, role)
    return out


def level(state: str, role: str | None, flagged: bool, z: float | None) -> int:
    if role == "culprit":
        return _LEVEL["culprit"]
    if state == "crashed":
        return _LEVEL["crashed"]
    if flagged:
        return _LEVEL["flagged"]
    if role is not None:
        return _LEVEL["affected"]
    if state in STALLED_STATES:
        return _LEVEL["stalled"]
    if z is not None and math.isfinite(z) and abs(z) >= FAR_Z:
        return _LEVEL["far"]
    return _LEVEL["ok"]


def rows_of(
    entries: Iterable[Mapping[str, Any]],
    metric: str,
    roles: Mapping[int, str],
    values: Mapping[int, float] | None = None,
    zs: Mapping[int, float] | None = None,
) -> list[Row]:
    """The table's rows, in rank order: one per rank entry (``feed.rank_entry`` or a stored
    rank's), its ``metric`` value and z from the entry, else from ``values``/``zs``."""
    values = values or {}
    zs = zs or {}
    rows: list[Row] = []
    for e in entries:
        rank = e.get("rank")
        if not isinstance(rank, int):
            continue
        own_values = e.get("values") or {}
        own_z = e.get("z") or {}
        value = _number(own_values[metric]) if metric in own_values else values.get(rank)
        z = _number(own_z[metric]) if metric in own_z else zs.get(rank)
        state = str(e.get("state") or "")
        role = roles.get(rank)
        divergent = list(e.get("divergent") or [])
        flagged = metric in divergent
        rows.append({
            "rank": rank,
            "host": str(e.get("host") or ""),
            "state": state,
            "last_step": e.get("last_step"),
            "last_seen": e.get("last_seen"),
            "value": value,
            "z": z,
            "flagged": flagged,
            "divergent": divergent,
            "role": role,
            "level": level(state, role, flagged, z),
            "message": str(e.get("message_line") or e.get("message") or ""),
            "throughput": _number(e.get("throughput")),
        })  # fmt: skip
    rows.sort(key=lambda r: r["rank"])
    return rows


def _matcher(query: Query) -> Callable[[Row], bool] | None:
    text = query.filter
    host = query.host
    tests: list[Callable[[Row], bool]] = []
    if host is not None:
        tests.append(lambda r: r["host"] == host)
    if text:
        word = text.lower()
        if m := RANGE.match(text):
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) else lo
            tests.append(lambda r: lo <= r["rank"] <= hi)
        elif word == "odd":
            tests.append(lambda r: r["level"] > _LEVEL["far"])
        elif word == "flagged":
            tests.append(lambda r: bool(r["divergent"]))
        elif word in ROLES:
            tests.append(lambda r: r["role"] == word)
        else:  # a state name, or part of a host name
            tests.append(lambda r: r["state"] == word or word in r["host"].lower())
    if not tests:
        return None
    return lambda r: all(t(r) for t in tests)


def _sort_key(key: str) -> Callable[[Row], Any]:
    if key == "attention":
        return lambda r: r["level"]
    if key == "value":
        return lambda r: r["value"]
    if key == "z":
        return lambda r: abs(r["z"])
    return lambda r: r[key]


def _missing(key: str, row: Row) -> bool:
    if key in ("value", "z"):
        v = row[key]
        return v is None or math.isnan(v)
    return key == "last_step" and row["last_step"] is None


def totals(rows: Sequence[Row]) -> dict[str, Any]:
    """What every page of ``rows`` says whatever it shows: the ranks counted by state and by
    level, and the flagged ones (the charts and the legend colour them on any page)."""
    levels = Counter(r["level"] for r in rows)
    flagged = [r for r in rows if r["divergent"]]
    return {
        "total": len(rows),
        "counts": dict(Counter(r["state"] for r in rows)),
        "levels": {LEVELS[i]: n for i, n in sorted(levels.items())},
        "odd": sum(n for i, n in levels.items() if i > _LEVEL["far"]),
        "divergent": [{"rank": r["rank"], "divergent": r["divergent"]}
                      for r in flagged[:MAX_DIVERGENT_LISTED]],
        "divergent_total": len(flagged),
    }  # fmt: skip


def ordered(rows: Sequence[Row], key: str, desc: bool) -> list[Row]:
    """``rows`` (in rank order) sorted by ``key``: missing values last whichever the direction,
    ties in rank order (a stable sort)."""
    have = [r for r in rows if not _missing(key, r)]
    out = sorted(have, key=_sort_key(key), reverse=desc)
    if len(have) < len(rows):
        out.extend(r for r in rows if _missing(key, r))
    return out


def select(
    rows: Sequence[Row],
    query: Query,
    known: Mapping[str, Any] | None = None,
    orders: dict[tuple[str, bool], list[Row]] | None = None,
) -> dict[str, Any]:
    """One page of ``rows`` (in rank order) sorted and filtered as ``query`` asks, with how
    many match, how many pages, and the ``totals`` (``known``: computed before). ``orders``
    keeps each order once sorted (a person clicks back and forth between a few). A page past
    the last is the last one (a filter that narrows the table keeps the person on a page)."""
    how = (query.sort, query.desc)
    order = orders.get(how) if orders is not None else None
    if order is None:
        order = ordered(rows, *how)
        if orders is not None:
            orders[how] = order
    match = _matcher(query)
    ordered_rows = [r for r in order if match(r)] if match is not None else order
    head, first = paged(query, len(ordered_rows))
    totals_ = known if known is not None else totals(rows)
    return {**totals_, **head, "rows": ordered_rows[first : first + query.size]}


def paged(query: Query, matched: int) -> tuple[dict[str, Any], int]:
    """The answer's page fields for ``matched`` rows, and the index of the page's first row."""
    pages = max(1, math.ceil(matched / query.size))
    page = min(query.page, pages)
    first = (page - 1) * query.size
    head = {
        "matched": matched,
        "page": page,
        "pages": pages,
        "size": query.size,
        "first": first + 1 if matched else 0,  # "showing first–last of matched"
        "last": min(first + query.size, matched),
        "sort": query.sort,
        "desc": query.desc,
        "filter": query.filter,
        "host": query.host,
    }
    return head, first


def node_cells(rows: Sequence[Row], max_cells: int = MAX_NODE_CELLS) -> dict[str, Any]:
    """``rows`` (in rank order) folded into cells: one per host when every rank has one and
    there are at most ``max_cells`` hosts, else blocks of consecutive ranks. Each cell: its
    name, first and last rank, rank count, worst level, the rank that has it, and its largest
    |z|. Cells in the order of their first rank."""
    groups: dict[str, list[Row]] = {}
    hosts = bool(rows) and all(r["host"] for r in rows)
    if hosts:
        for r in rows:
            groups.setdefault(r["host"], []).append(r)
        hosts = len(groups) <= max_cells
    block = None
    if not hosts:
        block = max(MIN_BLOCK_RANKS, math.ceil(len(rows) / max_cells))
        groups = {}
        for i in range(0, len(rows), block):
            part = list(rows[i : i + block])
            groups[f"ranks {part[0]['rank']}–{part[-1]['rank']}"] = part
    out: dict[str, list[Any]] = {k: [] for k in ("name", "first", "last", "count", "level",
                                                 "worst", "z")}  # fmt: skip
    for name, part in sorted(groups.items(), key=lambda kv: kv[1][0]["rank"]):
        worst = max(part, key=lambda r: (r["level"], -r["rank"]))
        far = [abs(r["z"]) for r in part if r["z"] is not None and math.isfinite(r["z"])]
        out["name"].append(name)
        out["first"].append(part[0]["rank"])
        out["last"].append(part[-1]["rank"])
        out["count"].append(len(part))
        out["level"].append(worst["level"])
        out["worst"].append(worst["rank"])
        out["z"].append(round(max(far), 2) if far else None)
    return {"by": "host" if hosts else "block", "block": block, "levels": list(LEVELS),
            "cells": len(out["name"]), "ranks": len(rows), **out}  # fmt: skip


def compact_cells(cells: dict[str, Any]) -> dict[str, Any]:
    """The node map as it is sent: a map of blocks of consecutive ranks (``start`` to
    ``start + ranks - 1``, ``block`` of them a cell) leaves out each cell's name, first and
    last rank and count, which follow from those three (nodemap.js puts them back): 12,500
    blocks send three numbers each."""
    n = cells["ranks"]
    if cells["by"] != "block" or not n or cells["last"][-1] - cells["first"][0] != n - 1:
        return cells
    out = {k: v for k, v in cells.items() if k not in ("name", "first", "last", "count")}
    return {**out, "start": cells["first"][0]}
