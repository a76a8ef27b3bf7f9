"""History runs in the snapshot: the runs the store holds that have no live state (from before
this aggregator started, imported, or retired long after they ended), with their final states.

Read from the store's in-memory summaries (``Store.runs``, ``Store.ranks``), never under the
service's lock. A stored run's entry only changes when a flush adds records to it, so each is
built once per change of its summary: the page asks for the run list every few seconds, and
rebuilding thousands of stored ranks each time would cost more than everything else it asks.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rankwatch.aggregator.snapshot import stored_rank_entry, stored_run_entry
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
                for gone in set(self._built) - {s["run"] for s in summaries}:
                    del self._built[gone]
        return out

    def _entry(self, summary: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        name = summary["run"]
        sig = tuple(summary.get(k) for k in ("ranks", "records", "last_time", "last_step"))
        with self._lock:
            built = self._built.get(name)
        if built is not None and built[0] == sig:
            return built[1], built[2]
        rows = self._store.ranks(name)
        life = self._life(name) if any(r.get("ended") for r in rows) else {}
        rank_entries = [stored_rank_entry(r, life.get(r["rank"])) for r in rows]
        entry = stored_run_entry(summary, rank_entries, self._store.metrics(name))
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
