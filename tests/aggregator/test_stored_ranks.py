"""``StoredRanks.of``: a stored run's host and state names turned into codes, checked against
``np.unique`` over the same columns (what it computed before), on seeded random columns with
NULLs, empty and non-ASCII names, ties and every kind of life event."""

from __future__ import annotations

import random

import numpy as np
import pytest
from rankwatch.aggregator.history import StoredRanks
from rankwatch.aggregator.snapshot import stored_rank_state

NAMES = ["node7", "node10", "", "nœud-é", "Node7", "节点3", "node7 ", "a" * 300]
LIVES = ["start", "end", "crash", "resume", ""]


def columns(rng: random.Random, n: int) -> dict[str, np.ndarray]:
    host = [rng.choice(NAMES) for _ in range(n)]
    life = [rng.choice(LIVES) for _ in range(n)]
    no_host = [rng.random() < 0.2 for _ in range(n)]
    no_life = [rng.random() < 0.3 for _ in range(n)]
    return {
        "rank": np.arange(n, dtype=np.int64),
        "host": np.ma.MaskedArray(np.array(host, dtype=object), mask=no_host),
        "life": np.ma.MaskedArray(np.array(life, dtype=object), mask=no_life),
        "ended": np.array([rng.random() < 0.5 for _ in range(n)]),
        "last_step": np.ma.MaskedArray(np.arange(n, dtype=np.int64), mask=no_host),
        "last_time": np.arange(n, dtype=np.float64),
    }


def unique_codes(values: np.ndarray) -> tuple[list[str], list[int]]:
    names, codes = np.unique(values.astype(str), return_inverse=True)
    return names.tolist(), codes.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_codes_answer_as_np_unique_did(seed: int) -> None:
    rng = random.Random(seed)
    cols = columns(rng, rng.choice([0, 1, 2, 17, 500]))
    got = StoredRanks.of(cols)

    host = np.ma.filled(cols["host"], "")
    assert (got.hosts, got.host.tolist()) == unique_codes(host)
    life = np.where(cols["ended"], np.ma.filled(cols["life"], ""), "")
    lives, life_code = unique_codes(life)
    names = [stored_rank_state(True, life or None) for life in lives]
    assert got.states == sorted(set(names))
    assert [got.states[c] for c in got.state.tolist()] == [names[c] for c in life_code]
    assert got.host.dtype == np.int64 and got.state.dtype == np.int64
