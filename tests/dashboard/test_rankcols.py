"""The rank table as columns (``rankcols``) against its definition, ``ranktable``'s functions
over every rank's row: the same answers for the table's rows of a small hand-made run, for a
few thousand random ranks (every kind of state, role, missing and non-finite value, ties), and
for stored runs written through the real Store and read back both ways: the old full build of
every rank entry, and the columns with rows for the page alone."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankwatch.agent.wire.records import EventRecord
from rankwatch.aggregator import history
from rankwatch.aggregator.store.db import Store
from rankwatch.dashboard import rankcols, ranktable, views

from .bigrun import BigRun, fill
from .test_ranktable import rows

FILTERS = ["", "odd", "flagged", "culprit", "affected", "terminated", "crashed", "finished",
           "unknown", "stalled", "n1", "N00", "3-40", "7", "nothing"]  # fmt: skip
HOSTS = [None, "n1", "node00002", "absent"]


def queries(size: str = "7") -> Iterator[ranktable.Query]:
    for sort in ranktable.SORTS:
        for desc in ("", "0", "1"):
            yield ranktable.parse_query(sort=sort, desc=desc, size=size, page="2")
    for text in FILTERS:
        for host in HOSTS:
            yield ranktable.parse_query(filter=text, host=host, size=size)
    yield ranktable.parse_query(sort="z", filter="odd", page="999", size=size)


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (a rank's value may be NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def check(old_rows: list[ranktable.Row], table: rankcols.Table, max_cells: int = 16) -> None:
    """Every query's page, the totals and the node map (by host and folded in blocks), from
    the columns as from the rows; the dict orders too (the JSON says them in that order)."""
    for query in queries():
        want = ranktable.select(old_rows, query)
        got = table.select(query)
        assert same(got, want), query
        assert list(got["counts"]) == list(want["counts"])
    assert same(table.node_cells(), ranktable.node_cells(old_rows))
    assert same(table.node_cells(max_cells), ranktable.node_cells(old_rows, max_cells))


def random_rows(n: int, seed: int) -> list[ranktable.Row]:
    rng = random.Random(seed)
    states = ["running", "running", "running", "stalled", "lost", "crashed", "finished"]
    entries = []
    for rank in rng.sample(range(n * 2), n):  # gaps in the rank numbers
        z = rng.choice([None, math.nan, math.inf, -math.inf, 0.0, -0.0, 3.0, -3.0,
                        round(rng.gauss(0, 2), 2)])  # fmt: skip
        value = rng.choice([None, math.nan, math.inf, 1.0, round(rng.random(), 3)])
        entries.append({
            "rank": rank, "state": rng.choice(states), "host": f"node{rank % 37:05d}",
            "last_step": rng.choice([None, 5, 10, 10, rng.randrange(100)]),
            "values": {} if value is None else {"loss": value},
            "z": {} if z is None else {"loss": z},
            "divergent": ["loss"] if rng.random() < 0.02 else [],
        })  # fmt: skip
    roles = {r["rank"]: rng.choice(ranktable.ROLES) for r in rng.sample(entries, 12)}
    return ranktable.rows_of(entries, "loss", roles)


def test_columns_answer_as_the_rows_do() -> None:
    check(rows(), rankcols.of_rows(rows()))
    mid = random_rows(3000, seed=24)
    check(mid, rankcols.of_rows(mid), max_cells=30)
    check([], rankcols.of_rows([]))


def test_levels_of_every_kind_of_rank_as_level_says() -> None:
    mid = random_rows(500, seed=7)
    table = rankcols.of_rows(mid)
    flagged = rankcols.np.array([bool(r["flagged"]) for r in mid])
    got = rankcols.levels_of(table.states, table.state, table.role, flagged, table.z)
    assert got.tolist() == [r["level"] for r in mid]


def test_compact_node_map_leaves_out_only_what_follows() -> None:
    cells = ranktable.node_cells(ranktable.rows_of([{"rank": r} for r in range(20)], "x", {}))
    small = ranktable.compact_cells(cells)
    assert small["start"] == 0 and not {"name", "first", "last", "count"} & set(small)
    assert {k: v for k, v in cells.items() if k in small} == {
        k: v for k, v in small.items() if k != "start"
    }
    gapped = ranktable.node_cells(ranktable.rows_of([{"rank": r} for r in (0, 2, 3)], "x", {}))
    assert ranktable.compact_cells(gapped) == gapped  # the ranks are not consecutive
    hosts = ranktable.node_cells(rows())
    assert ranktable.compact_cells(hosts) == hosts


# --- stored runs through the real Store -------------------------------------------------------


def stored_rows(store: Store, run: str, roles: dict[int, str]) -> list[ranktable.Row]:
    """The old full build: every rank's entry, its latest value and z, then the rows."""
    runs = history.StoredRuns(store)
    (entry,) = runs.entries(store.runs(), set(), run=run)
    ranks, values = store.latest_values(run, "loss")
    latest = dict(zip(ranks.tolist(), values.tolist(), strict=True))
    return ranktable.rows_of(entry["ranks"], "loss", roles, latest, views.latest_z(latest))


def stored_table(store: Store, run: str, roles: dict[int, str]) -> rankcols.Table:
    """The table the route builds: the latest values and their z as columns."""
    ranks, values = store.latest_values(run, "loss")
    columns = history.StoredRuns(store).columns(run)
    zs = views.latest_z_columns(ranks, values, "loss")
    return rankcols.stored(columns, "loss", roles, (ranks, values), zs)


def lives(big: BigRun, t0: float) -> list[EventRecord]:
    """Ranks that ended every way a stored rank can: finished, crashed, restarted after a
    crash (unknown again), a start alone (unknown)."""

    def ev(rank: int, seq: int, t: float, kind: str) -> EventRecord:
        return EventRecord(big.run, rank, seq, t, big.world, "", 1, kind, 3, {})

    out = [ev(r, 10, t0 + 10, "end") for r in range(0, big.world, 5)]
    out += [ev(7, 11, t0 + 11, "crash"), ev(7, 12, t0 + 12, "start")]
    out += [ev(9, 13, t0 + 13, "start"), ev(11, 14, t0 + 14, "crash")]
    return out


@pytest.mark.parametrize(("world", "hosts_world"), [(300, 16), (2000, 520)])
def test_stored_run_columns_answer_as_the_full_build(
    tmp_path: Path, world: int, hosts_world: int
) -> None:
    data = tmp_path / "data"
    big, named = fill(data, world=world, steps=3, hosts_world=hosts_world)
    with Store(data) as store:
        store.append(lives(big, store.runs()[0]["first_time"]))
        store.flush()
        for run, roles in ((big, {big.culprit: "culprit", big.affected[0]: "affected"}),
                           (named, {})):  # fmt: skip
            old = stored_rows(store, run.run, roles)
            assert len(old) == run.world
            check(old, stored_table(store, run.run, roles), max_cells=world // 40)
        # the run list's entries, counted in the store: the full build's without rank entries
        counted = history.StoredRuns(store).entries(store.runs(), set(), ranks=False)
        # every run listed (status): the unfinished ranks, at most MAX_LISTED_RANKS of them
        every = history.StoredRuns(store).entries(store.runs(), set())
        for entry, some in zip(counted, every, strict=True):
            (whole,) = history.StoredRuns(store).entries(store.runs(), set(), run=entry["run"])
            assert entry["ranks_seen"] == len(whole["ranks"]) and entry["metrics"] == ["loss"]
            assert {k: v for k, v in entry.items() if k not in ("metrics", "ranks_seen")} == {
                k: v for k, v in whole.items() if k != "ranks"
            }
            assert list(entry["rank_states"]) == list(whole["rank_states"])
            shown = history.listed(whole["ranks"], everyone=False)
            seen = {} if len(shown) == len(whole["ranks"]) else {"ranks_seen": len(whole["ranks"])}
            assert some == {**whole, "ranks": shown, **seen}
            assert len(shown) == min(history.MAX_LISTED_RANKS, len(whole["ranks"]))
        finished = len(range(0, world, 5))
        assert next(e for e in counted if e["run"] == big.run)["rank_states"] == {
            "finished": finished, "unknown": world - finished - 2, "crashed": 2
        }  # fmt: skip


@pytest.mark.parametrize("world", [60, 3000])
def test_stored_run_of_random_values_with_ties_answers_as_the_full_build(
    tmp_path: Path, world: int
) -> None:
    """Latest values on a coarse grid (many ranks share a value and so a z), NaN, infinities,
    ranks far off, and ranks with no latest value (they stopped long before the others)."""
    rng = np.random.default_rng(world)
    run = "ties"
    stopped = rng.choice(world, world // 10, replace=False)
    going = np.setdiff1d(np.arange(world), stopped)
    last = 1500  # past the store's window of latest steps from the stopped ranks' step 1
    rank = np.concatenate([np.arange(world), going])
    step = np.concatenate([np.ones(world, np.int64), np.full(len(going), last)])
    loss = 2.0 + 0.001 * rng.integers(-12, 13, len(rank))
    loss[rng.choice(len(rank), len(rank) // 15)] = np.nan
    loss[rng.choice(len(rank), 4)] = [np.inf, -np.inf, 30.0, -30.0]
    with Store(tmp_path / "data") as store:
        store.append_steps(run, "loss", rank, step, loss, time_s=1e9 + step, world_size=world)
        store.flush()
        roles = {int(going[0]): "culprit", int(going[1]): "affected", int(stopped[0]): "affected"}
        old = stored_rows(store, run, roles)
        assert len(old) == world
        assert sum(r["value"] is None for r in old) == len(stopped)
        zs = [abs(r["z"]) for r in old if r["z"] is not None and math.isfinite(r["z"])]
        assert len(zs) - len(set(zs)) > world // 2  # ties the sort by z breaks in rank order
        assert any(r["level"] == ranktable.LEVELS.index("far") for r in old)
        check(old, stored_table(store, run, roles), max_cells=world // 20)
