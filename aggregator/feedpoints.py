"""The live feed's ``points`` messages: a tick's step records and blocks as one message per
(run, metric), ``{"type": "points", "run", "metric", "points": [[rank, step, value], ...],
"sampled"?}`` (``feed.py`` has the other shapes), non-finite values written as JSONL does."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from rankwatch.agent.wire.jsonsafe import json_value
from rankwatch.agent.wire.records import RanksBlock, StepBlock, StepRecord


def points_messages(
    steps: Sequence[StepRecord | StepBlock | RanksBlock], max_points: int
) -> tuple[list[dict[str, Any]], bool]:
    """One ``points`` message per (run, metric); beyond ``max_points`` values every k-th
    record is kept (a browser cannot draw more per tick; it re-reads the store when it zooms).
    A ``StepBlock`` or ``RanksBlock`` counts as its records, in order."""
    total = sum(len(r.metrics) * (1 if isinstance(r, StepRecord) else len(r)) for r in steps)
    sampled = total > max_points
    every = math.ceil(total / max_points) if sampled else 1
    by_metric: dict[tuple[str, str], list[list[Any]]] = {}
    # Records are kept as rows per run until a block comes, then written metric by metric
    # (a list comprehension per metric costs far less than a loop per value at thousands of
    # ranks); the points and their order are those of a loop over the records.
    rows: dict[str, list[tuple[int, int, Mapping[str, float]]]] = {}
    at = 0  # records before this one: record i is kept when i % every == 0
    for rec in steps:
        if type(rec) is RanksBlock:
            _rows_points(rows, by_metric)
            first = -at % every
            at += len(rec)
            kept = list(zip(rec.ranks[first::every], rec.step[first::every], strict=True))
            for metric, column in rec.metrics.items():
                points = by_metric.get((rec.run, metric))
                if points is None:
                    points = by_metric[(rec.run, metric)] = []
                points += [
                    [rank, step, value if math.isfinite(value) else json_value(value)]
                    for (rank, step), value in zip(kept, column[first::every], strict=True)
                ]
            continue
        run, rank = rec.run, rec.rank
        if isinstance(rec, StepBlock):
            _rows_points(rows, by_metric)
            first = -at % every
            at += len(rec)
            block_steps = rec.step[first::every]
            for metric, column in rec.metrics.items():
                points = by_metric.get((run, metric))
                if points is None:
                    points = by_metric[(run, metric)] = []
                points += [
                    [rank, step, value if math.isfinite(value) else json_value(value)]
                    for step, value in zip(block_steps, column[first::every], strict=True)
                ]
            continue
        at += 1
        if (at - 1) % every:
            continue
        held = rows.get(run)
        if held is None:
            held = rows[run] = []
        held.append((rank, rec.step, rec.metrics))
    _rows_points(rows, by_metric)
    messages = []
    for (run, metric), points in by_metric.items():
        message: dict[str, Any] = {"type": "points", "run": run, "metric": metric, "points": points}
        if sampled:
            message["sampled"] = True
        messages.append(message)
    return messages, sampled


_third = itemgetter(2)


def _rows_points(
    rows: dict[str, list[tuple[int, int, Mapping[str, float]]]],
    by_metric: dict[tuple[str, str], list[list[Any]]],
) -> None:
    """Write the held rows' points into ``by_metric`` (metrics in order of first appearance,
    points in record order) and forget them."""
    for run, held in rows.items():
        names = dict.fromkeys(chain.from_iterable(m for _, _, m in held))
        every_name = all(len(m) == len(names) for _, _, m in held)
        for metric in names:
            points = by_metric.get((run, metric))
            if points is None:
                points = by_metric[(run, metric)] = []
            new: list[list[Any]]
            if every_name:
                new = [[rank, step, m[metric]] for rank, step, m in held]
            else:
                new = [[rank, step, m[metric]] for rank, step, m in held if metric in m]
            # a sum of finite values is finite (or overflows: then checked one by one)
            if not math.isfinite(sum(map(_third, new))):
                for point in new:
                    if not math.isfinite(point[2]):
                        point[2] = json_value(point[2])
            points += new
    rows.clear()
