"""Finding the rows of a value in a column of a burst without a Python step per row. Pure."""

from __future__ import annotations

from itertools import compress, repeat
from operator import eq
from typing import TypeVar

__all__ = ["FEW_ROWS", "positions"]

_V = TypeVar("_V")
FEW_ROWS = 64  # rows of a value found one by one with ``list.index``; past it, in one pass


def positions(values: list[_V], value: _V, count: int | None = None) -> list[int]:
    """The indices of ``values`` holding ``value``: counted first (``list.count`` compares in
    C, no objects made; ``count``: that number, when the caller keeps it), then found by
    ``index`` when they are few, else in one pass."""
    k = values.count(value) if count is None else count
    if k == len(values):
        return list(range(k))
    if k <= FEW_ROWS:
        out, at = [], -1
        for _ in range(k):
            at = values.index(value, at + 1)
            out.append(at)
        return out
    return list(compress(range(len(values)), map(eq, values, repeat(value))))
