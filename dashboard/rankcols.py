"""The rank table as columns: ``ranktable``'s sort, filter, page, totals and node map over numpy
arrays, with rows built only for the ranks a page shows. Pure.

A stored run of 100,000 ranks is read as columns (``StoredRanks``) and never becomes 100,000
rows: ``stored`` makes the table of it, and a page's rows are built from the entries of its own
ranks. A live run's rows (``ranktable.rows_of``) are folded into columns once (``of_rows``).
``ranktable``'s functions over lists of rows are the definition; the tests check this module's
answers against them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rankwatch.aggregator.provider import StoredRanks

from . import ranktable
from .ranktable import LEVELS, MIN_BLOCK_RANKS, ROLES, Query, Row

_FAR = LEVELS.index("far")
_MISSING_WHEN_NAN = ("value", "z", "last_step")

Columns = tuple[np.ndarray, np.ndarray]  # (ranks int64, values float64): a value per rank
RowMaker = Callable[[np.ndarray], list[Row]]  # positions in rank order -> their rows, in order


@dataclass
class Table:
    """One run's rank table, each column in rank order. ``hosts`` and ``states``: the distinct
    names, sorted (so their codes sort as the names do); ``role``: an index of ``ROLES``, -1
    for none; ``value``, ``z``, ``last_step``: NaN where missing or not a number."""

    rank: np.ndarray
    host: np.ndarray
    hosts: list[str]
    state: np.ndarray
    states: list[str]
    last_step: np.ndarray
    value: np.ndarray
    z: np.ndarray
    role: np.ndarray
    divergent: np.ndarray  # bool: flagged on any metric
    level: np.ndarray
    make_rows: RowMaker
    orders: dict[tuple[str, bool], np.ndarray] = field(default_factory=dict)
    _totals: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        return len(self.rank)

    def totals(self) -> dict[str, Any]:
        """``ranktable.totals`` of the table's rows."""
        if self._totals is None:
            self._totals = self._count()
        return self._totals

    def _count(self) -> dict[str, Any]:
        codes, first, counts = np.unique(self.state, return_index=True, return_counts=True)
        by_first = np.argsort(first, kind="stable")  # Counter's order: first seen, in rank order
        levels, per_level = np.unique(self.level, return_counts=True)
        flagged = np.flatnonzero(self.divergent)
        listed = self.make_rows(flagged[: ranktable.MAX_DIVERGENT_LISTED])
        return {
            "total": self.size,
            "counts": {self.states[codes[i]]: int(counts[i]) for i in by_first},
            "levels": {LEVELS[lv]: int(n) for lv, n in zip(levels, per_level, strict=True)},
            "odd": int(per_level[levels > _FAR].sum()),
            "divergent": [{"rank": r["rank"], "divergent": r["divergent"]} for r in listed],
            "divergent_total": len(flagged),
        }

    def ordered(self, key: str, desc: bool) -> np.ndarray:
        """``ranktable.ordered``: positions sorted by ``key``, missing values last whichever the
        direction, ties in rank order."""
        order = self.orders.get((key, desc))
        if order is not None:
            return order
        values = {
            "attention": self.level,
            "rank": self.rank,
            "state": self.state,
            "host": self.host,
            "last_step": self.last_step,
            "value": self.value,
            "z": np.abs(self.z),
        }[key]
        if key in _MISSING_WHEN_NAN:
            missing = np.isnan(values)
            have = np.flatnonzero(~missing)
        else:
            missing = None
            have = np.arange(self.size)
        keys = values[have]
        order = have[np.argsort(-keys if desc else keys, kind="stable")]
        if missing is not None and missing.any():
            order = np.concatenate([order, np.flatnonzero(missing)])
        self.orders[(key, desc)] = order
        return order

    def matches(self, query: Query) -> np.ndarray | None:
        """``ranktable``'s filter as a mask over the table's positions; None: every rank."""
        masks = []
        if query.host is not None:
            named = [i for i, h in enumerate(self.hosts) if h == query.host]
            masks.append(np.isin(self.host, named))
        text = query.filter
        if text:
            word = text.lower()
            if m := ranktable.RANGE.match(text):
                lo = int(m.group(1))
                hi = int(m.group(2)) if m.group(2) else lo
                masks.append((self.rank >= lo) & (self.rank <= hi))
            elif word == "odd":
                masks.append(self.level > _FAR)
            elif word == "flagged":
                masks.append(self.divergent)
            elif word in ROLES:
                masks.append(self.role == ROLES.index(word))
            else:  # a state name, or part of a host name
                states = [i for i, s in enumerate(self.states) if s == word]
                hosts = [i for i, h in enumerate(self.hosts) if word in h.lower()]
                masks.append(np.isin(self.state, states) | np.isin(self.host, hosts))
        if not masks:
            return None
        out = masks[0]
        for mask in masks[1:]:
            out = out & mask
        return out

    def select(self, query: Query) -> dict[str, Any]:
        """``ranktable.select`` of the table's rows."""
        order = self.ordered(query.sort, query.desc)
        mask = self.matches(query)
        if mask is not None:
            order = order[mask[order]]
        head, first = ranktable.paged(query, len(order))
        return {**self.totals(), **head, "rows": self.make_rows(order[first : first + query.size])}

    def node_cells(self, max_cells: int = ranktable.MAX_NODE_CELLS) -> dict[str, Any]:
        """``ranktable.node_cells`` of the table's rows."""
        n = self.size
        if n == 0:
            return ranktable.node_cells([], max_cells)
        by_host = n > 0 and "" not in self.hosts and len(self.hosts) <= max_cells
        block = None
        if by_host:
            perm = np.argsort(self.host, kind="stable")  # each host's ranks in rank order
            codes = self.host[perm]
            starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        else:
            block = max(MIN_BLOCK_RANKS, math.ceil(n / max_cells))
            perm = np.arange(n)
            starts = np.arange(0, n, block)
        ends = np.r_[starts[1:], n].astype(np.int64)
        ranks = self.rank[perm]
        first, last = ranks[starts], ranks[ends - 1]
        count = ends - starts
        levels = self.level[perm]
        worst_level = np.maximum.reduceat(levels, starts)
        group = np.repeat(np.arange(len(starts)), count)
        at_worst = np.flatnonzero(levels == worst_level[group])  # the first is the lowest rank
        worst = ranks[at_worst[np.unique(group[at_worst], return_index=True)[1]]]
        far = np.abs(self.z[perm])
        far[~np.isfinite(far)] = -1.0
        far_z = np.maximum.reduceat(far, starts)
        cells = np.argsort(first, kind="stable")
        if by_host:
            names = [self.hosts[c] for c in codes[starts][cells].tolist()]
        else:
            names = [f"ranks {a}–{b}" for a, b in zip(first.tolist(), last.tolist(), strict=True)]
        return {
            "by": "host" if by_host else "block",
            "block": block,
            "levels": list(LEVELS),
            "cells": len(starts),
            "ranks": n,
            "name": names,
            "first": first[cells].tolist(),
            "last": last[cells].tolist(),
            "count": count[cells].tolist(),
            "level": worst_level[cells].tolist(),
            "worst": worst[cells].tolist(),
            "z": [round(z, 2) if z >= 0 else None for z in far_z[cells].tolist()],
        }


def _codes(names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    distinct, codes = np.unique(np.asarray(names, dtype=str), return_inverse=True)
    return codes.astype(np.int64), distinct.tolist()


def _floats(values: Sequence[Any]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def _roles(ranks: np.ndarray, roles: Mapping[int, str]) -> np.ndarray:
    out = np.full(len(ranks), -1, dtype=np.int64)
    if roles:
        known = np.array(sorted(roles), dtype=np.int64)
        pos = np.searchsorted(ranks, known)
        pos_ok = pos < len(ranks)
        found = np.zeros(len(known), dtype=bool)
        found[pos_ok] = ranks[pos[pos_ok]] == known[pos_ok]
        out[pos[found]] = [ROLES.index(roles[int(r)]) for r in known[found]]
    return out


def levels_of(
    states: Sequence[str], state: np.ndarray, role: np.ndarray, flagged: np.ndarray, z: np.ndarray
) -> np.ndarray:
    """``ranktable.level`` of every rank, asked once per kind of rank (state, role, flagged,
    far or not)."""
    far = np.isfinite(z) & (np.abs(z) >= ranktable.FAR_Z)
    kinds = ((state * (len(ROLES) + 1) + role + 1) * 2 + flagged) * 2 + far
    distinct, inverse = np.unique(kinds, return_inverse=True)
    out = []
    for kind in distinct.tolist():
        rest, is_far = divmod(kind, 2)
        rest, is_flagged = divmod(rest, 2)
        code, role_code = divmod(rest, len(ROLES) + 1)
        role_name = ROLES[role_code - 1] if role_code else None
        z_of = ranktable.FAR_Z if is_far else None
        out.append(ranktable.level(states[code], role_name, bool(is_flagged), z_of))
    return np.asarray(out, dtype=np.int64)[inverse]


def _role_code(role: str | None) -> int:
    return -1 if role is None else ROLES.index(role)


def of_rows(rows: Sequence[Row]) -> Table:
    """The table of ``rows`` (``ranktable.rows_of``: in rank order)."""
    host, hosts = _codes([r["host"] for r in rows])
    state, states = _codes([r["state"] for r in rows])
    kept = list(rows)
    return Table(
        rank=np.array([r["rank"] for r in rows], dtype=np.int64),
        host=host,
        hosts=hosts,
        state=state,
        states=states,
        last_step=_floats([r["last_step"] for r in rows]),
        value=_floats([r["value"] for r in rows]),
        z=_floats([r["z"] for r in rows]),
        role=np.array([_role_code(r["role"]) for r in rows], dtype=np.int64),
        divergent=np.array([bool(r["divergent"]) for r in rows], dtype=bool),
        level=np.array([r["level"] for r in rows], dtype=np.int64),
        make_rows=lambda at: [kept[i] for i in at.tolist()],
    )


def stored(
    ranks: StoredRanks,
    metric: str,
    roles: Mapping[int, str],
    latest: Columns,
    zs: Columns,
) -> Table:
    """The table of a stored run: its ranks' columns, their latest ``metric`` values and the z
    of them (``latest``, ``zs``: (ranks, values) columns, a rank absent where it has none),
    each rank's part in the incident."""
    rank = ranks.rank
    role = _roles(rank, roles)
    value, has_value = _aligned(rank, *latest)
    z, has_z = _aligned(rank, *zs)
    none = np.zeros(len(rank), dtype=bool)  # a stored rank is flagged on nothing

    def make_rows(at: np.ndarray) -> list[Row]:
        entries = ranks.entries(at)
        picked = [e["rank"] for e in entries]
        values = _present(rank[at], value[at], has_value[at])
        z_of = _present(rank[at], z[at], has_z[at])
        by_rank = {r["rank"]: r for r in ranktable.rows_of(entries, metric, roles, values, z_of)}
        return [by_rank[r] for r in picked]

    return Table(
        rank=rank,
        host=ranks.host,
        hosts=ranks.hosts,
        state=ranks.state,
        states=ranks.states,
        last_step=ranks.last_step,
        value=value,
        z=z,
        role=role,
        divergent=none,
        level=levels_of(ranks.states, ranks.state, role, none, z),
        make_rows=make_rows,
    )


def _aligned(
    ranks: np.ndarray, keys: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``values[i]`` of rank ``keys[i]`` as a column over ``ranks`` (ascending), NaN where
    absent; and where each rank has one."""
    out = np.full(len(ranks), math.nan)
    have = np.zeros(len(ranks), dtype=bool)
    if len(keys):
        keys = np.asarray(keys, dtype=np.int64)
        pos = np.searchsorted(ranks, keys)
        ok = pos < len(ranks)
        ok[ok] = ranks[pos[ok]] == keys[ok]
        out[pos[ok]] = np.asarray(values, dtype=np.float64)[ok]
        have[pos[ok]] = True
    return out, have


def _present(ranks: np.ndarray, values: np.ndarray, have: np.ndarray) -> dict[int, float]:
    """rank -> value, for the ranks that have one."""
    return {
        r: v for r, v, ok in zip(ranks.tolist(), values.tolist(), have.tolist(), strict=True) if ok
    }
