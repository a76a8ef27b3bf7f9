"""History runs in the snapshot: the runs the store holds that have no live state (from before
this aggregator started, imported, or retired long after they ended), with their final states.

Read from the store (``Store.runs``, ``Store.ranks``), never under the service's lock. A stored
run's entry only changes when a flush adds records to it, so each is built once per change of
its summary: the page asks for the run list every few seconds. A run list needs its runs' ranks
counted by state only: that is one aggregate query (``Store.rank_lives``), and rank entries are
built only where they are listed. The rank table of a stored run reads its ranks as columns
(``StoredRanks``) and builds the entries of the ranks a page shows.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
from rankwatch.aggregator.snapshot import stored_rank_entry, stored_rank_state, stored_run_entry
from rankwatch.aggregator.store.db import Store, StoreError

LIFE_EVENTS = ("start", "end", "crash")
# Ranks of a stored run listed when every run is asked for (``/api/status``): a store of many
# big runs would make an answer of millions of rank entries. The unfinished ones come first;
# ``rank_states`` counts them all, and asking for the one run lists every rank.
MAX_LISTED_RANKS = 64

Signature = tuple[Any, ...]  # what of a run's summary changes when records are added


def listed(ranks: list[dict[str, Any]], everyone: bool) -> list[dict[str, Any]]:
    if everyone or len(ranks) <= MAX_LISTED_RANKS:
        return list(ranks)
    news = [r for r in ranks if r["state"] != "finished"]
    return news[:MAX_LISTED_RANKS]


class StoredRuns:
    """Snapshot entries of stored runs, rebuilt when a run's stored summary changes."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._built: dict[str, tuple[Signature, dict[str, Any], list[dict[str, Any]]]] = {}
        self._counted: dict[str, tuple[Signature, dict[str, Any]]] = {}  # without rank entries
        self._unfinished: dict[str, tuple[Signature, list[dict[str, Any]]]] = {}  # listed ones

    def entries(
        self,
        summaries: Sequence[Mapping[str, Any]],
        skip: Collection[str],
        run: str | None = None,
        ranks: bool = True,
    ) -> list[dict[str, Any]]:
        """An entry per stored run (``summaries``: ``Store.runs()``) not in ``skip`` (the live
        ones), or ``run``'s only; with the rank entries when ``ranks``."""
        out = []
        for summary in summaries:
            name = summary["run"]
            if name in skip or (run is not None and name != run):
                continue
            try:
                if not ranks:
                    out.append(dict(self._counted_entry(summary)))
                    continue
                if run is None and self._lists_some(summary):
                    entry = dict(self._counted_entry(summary))
                    entry["ranks"] = self._unfinished_entries(summary)
                    del entry["metrics"]
                    out.append(entry)
                    continue
                entry, rank_entries = self._entry(summary)
            except StoreError:  # closed while stopping: the live runs are still worth showing
                break
            entry = dict(entry)
            if ranks:
                entry["ranks"] = listed(rank_entries, everyone=run is not None)
                del entry["metrics"]
                if len(entry["ranks"]) == len(rank_entries):
                    del entry["ranks_seen"]
            out.append(entry)
        if run is None:  # forget the runs the store no longer lists
            with self._lock:
                names = {s["run"] for s in summaries}
                for gone in set(self._built) - names:
                    del self._built[gone]
                for gone in set(self._counted) - names:
                    del self._counted[gone]
                for gone in set(self._unfinished) - names:
                    del self._unfinished[gone]
        return out

    def _counted_entry(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """The run's entry without its rank entries: its ranks counted by state in the store."""
        name = summary["run"]
        sig = _signature(summary)
        with self._lock:
            built = self._built.get(name)
            counted = self._counted.get(name)
        if built is not None and built[0] == sig:
            return built[1]
        if counted is not None and counted[0] == sig:
            return counted[1]
        states: dict[str, int] = {}
        for ended, life, n in self._store.rank_lives(name):  # in the order of their first rank
            state = stored_rank_state(ended, life)
            states[state] = states.get(state, 0) + n
        entry = stored_run_entry(summary, states, self._store.metrics(name))
        with self._lock:
            self._counted[name] = (sig, entry)
        return entry

    def _lists_some(self, summary: Mapping[str, Any]) -> bool:
        """Whether listing every run lists only some of this one's ranks (``listed``), and
        those are not built yet: then they are found in its columns, not in every entry."""
        if int(summary.get("ranks") or 0) <= MAX_LISTED_RANKS:
            return False
        with self._lock:
            built = self._built.get(summary["run"])
        return built is None or built[0] != _signature(summary)

    def _unfinished_entries(self, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``listed(every rank entry, everyone=False)`` of a run of more ranks than that lists,
        built for the listed ranks alone."""
        name, sig = summary["run"], _signature(summary)
        with self._lock:
            kept = self._unfinished.get(name)
        if kept is not None and kept[0] == sig:
            return list(kept[1])
        cols = self.columns(name)
        finished = [i for i, state in enumerate(cols.states) if state == "finished"]
        at = np.flatnonzero(~np.isin(cols.state, finished))[:MAX_LISTED_RANKS]
        found = cols.entries(at)
        with self._lock:
            self._unfinished[name] = (sig, found)
        return list(found)

    def columns(self, run: str) -> StoredRanks:
        """``run``'s stored ranks as columns (none: a run the store does not hold)."""
        return StoredRanks.of(self._store.rank_columns(run))

    def _entry(self, summary: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        name = summary["run"]
        sig = _signature(summary)
        with self._lock:
            built = self._built.get(name)
        if built is not None and built[0] == sig:
            return built[1], built[2]
        rows = self._store.ranks(name)
        life = self._life(name) if any(r.get("ended") for r in rows) else {}
        rank_entries = [stored_rank_entry(r, life.get(r["rank"])) for r in rows]
        states = Counter(r["state"] for r in rank_entries)
        entry = stored_run_entry(summary, states, self._store.metrics(name))
        with self._lock:
            self._built[name] = (sig, entry, rank_entries)
        return entry, rank_entries

    def _life(self, run: str) -> dict[int, str]:
        """Each rank's last start, end or crash event (the store's summary only says whether
        the last one ended the rank, not how)."""
        last: dict[int, str] = {}
        for ev in self._store.events(run):  # in time order
            if ev["event"] in LIFE_EVENTS:
                last[ev["rank"]] = ev["event"]
        return last


def _signature(summary: Mapping[str, Any]) -> Signature:
    return tuple(summary.get(k) for k in ("ranks", "records", "last_time", "last_step"))


@dataclass(frozen=True)
class StoredRanks:
    """A stored run's ranks as columns, in rank order (``Store.rank_columns``): what its rank
    table sorts and filters on, and the rank entries of the ranks a page shows, built for those
    alone. ``hosts``, ``states``: the distinct names, sorted; ``host`` and ``state`` index
    them. ``last_step``: NaN where a rank has none."""

    rank: np.ndarray  # int64
    host: np.ndarray  # int64 codes into hosts
    hosts: list[str]
    state: np.ndarray  # int64 codes into states
    states: list[str]
    last_step: np.ndarray  # float64
    last_seen: np.ndarray  # float64
    _cols: Mapping[str, np.ndarray]

    @classmethod
    def of(cls, cols: Mapping[str, np.ndarray]) -> StoredRanks:
        host = np.ma.filled(np.ma.asarray(cols["host"], dtype=object), "")
        hosts, host_code = _codes(host)
        life = np.ma.filled(np.ma.asarray(cols["life"], dtype=object), "")
        ended = np.ma.filled(np.ma.asarray(cols["ended"], dtype=bool), False)
        # "": no life event, or not ended; either way what stored_rank_state calls unknown
        lives, life_code = _codes(np.where(ended, life, ""))
        names = [stored_rank_state(True, life or None) for life in lives]
        states = sorted(set(names))
        remap = np.array([states.index(n) for n in names], dtype=np.int64)
        step = np.ma.asarray(cols["last_step"], dtype=np.float64)
        return cls(
            rank=np.asarray(cols["rank"], dtype=np.int64),
            host=host_code.astype(np.int64),
            hosts=hosts,
            state=remap[life_code] if len(remap) else np.zeros(0, np.int64),
            states=states,
            last_step=np.ma.filled(step, np.nan),
            last_seen=np.ma.filled(np.ma.asarray(cols["last_time"], dtype=np.float64), np.nan),
            _cols=cols,
        )

    def entries(self, at: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The rank entries (``stored_rank_entry``) of the ranks at positions ``at``."""
        at = np.asarray(at, dtype=np.int64)
        picked = {k: _plain(np.ma.asarray(v)[at]) for k, v in self._cols.items()}
        out = []
        for i in range(len(at)):
            row = {k: v[i] for k, v in picked.items()}
            out.append(stored_rank_entry(row, row.pop("life")))
        return out


def _codes(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct names of ``values`` (strings, as objects), sorted, and each value's index
    among them: ``np.unique(values.astype(str), return_inverse=True)``'s answer without sorting
    100,000 strings. A dict gives each distinct name the position it first appears at (in C:
    the map, the counter and ``setdefault``); only the distinct names are sorted."""
    items = values.tolist()
    seen: dict[str, int] = {}
    first = np.fromiter(map(seen.setdefault, items, count()), np.int64, len(items))
    names = sorted(seen)
    code = np.zeros(len(items), np.int64)
    code[[seen[n] for n in names]] = np.arange(len(names), dtype=np.int64)
    return names, code[first]


def _plain(values: np.ma.MaskedArray) -> list[Any]:
    """Python values, None where masked (SQL NULL)."""
    if not np.ma.is_masked(values):
        return np.ma.getdata(values).tolist()
    data, mask = values.data.tolist(), np.ma.getmaskarray(values).tolist()
    return [None if m else v for v, m in zip(data, mask, strict=True)]
