"""The dashboard's read interface: everything a page or ``rankwatch status`` may ask of the
aggregator, typed, in one place (TensorBoard's ``DataProvider`` is the model: plugins see
``list_runs``/``read_scalars``, never the storage).

``DataProvider`` is the protocol the dashboard is written against; ``AggregatorProvider`` is
the one implementation, over a running ``Aggregator``. The dashboard imports nothing else from
``rankwatch.aggregator``: the value types its methods return are re-exported here, so the
store's engine, the alert engine and the feed's internals can change without touching a route.
The pure functions a view needs (the detector's z for the heatmap, the known metrics' display
order) are re-exported too, so a cell's colour means what the detector means.

Store reads block (DuckDB) and are safe from any thread; the routes call them from FastAPI's
thread pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np
from rankwatch.agent.wire.records import Record, StepBlock
from rankwatch.aggregator.actions.desk import ActionError
from rankwatch.aggregator.alerts.rules import Alert
from rankwatch.aggregator.compare import compare_medians, previous_run
from rankwatch.aggregator.divergence.zcolumn import z_step_columns
from rankwatch.aggregator.divergence.zgrid import ZGrid, z_columns, z_grid, z_step
from rankwatch.aggregator.feed import FeedClosed, Subscription, ranks_delta
from rankwatch.aggregator.history import StoredRanks
from rankwatch.aggregator.metrics import display_order, metric_info
from rankwatch.aggregator.ranksummary import MAX_PAGE_RANKS, SUMMARY_RANKS
from rankwatch.aggregator.stacks import StackView, stack_view
from rankwatch.aggregator.store.columns import BAND_KEYS, SeriesColumns
from rankwatch.aggregator.store.export import FORMATS as EXPORT_FORMATS
from rankwatch.aggregator.store.export import ExportError, export_run, export_telemetry
from rankwatch.aggregator.telemetry import cards as hw_cards
from rankwatch.aggregator.telemetry.metrics import BY_NAME as _TELEMETRY_METRICS
from rankwatch.aggregator.telemetry.metrics import TelemetryMetric, order_key
from rankwatch.aggregator.telemetry.metrics import info as telemetry_info

if TYPE_CHECKING:
    from rankwatch.aggregator.service import Aggregator

__all__ = [
    "BAND_KEYS",
    "EXPORT_FORMATS",
    "MAX_PAGE_RANKS",
    "SUMMARY_RANKS",
    "ActionError",
    "AggregatorProvider",
    "Alert",
    "Band",
    "Counters",
    "DataProvider",
    "ExportError",
    "FeedClosed",
    "Hardware",
    "LiveRun",
    "SeriesColumns",
    "SeriesLists",
    "Snapshot",
    "StackView",
    "StoredEvent",
    "StoredRanks",
    "StoredRun",
    "Subscription",
    "TelemetryMetric",
    "TelemetrySeries",
    "ZGrid",
    "compare_medians",
    "display_order",
    "metric_info",
    "previous_run",
    "ranks_delta",
    "telemetry_info",
    "telemetry_metrics",
    "z_columns",
    "z_grid",
    "z_step",
    "z_step_columns",
]

Band = dict[str, np.ndarray]  # BAND_KEYS -> column: "step" int64, the statistics float64
SeriesLists = dict[int, dict[str, list[Any]]]  # rank -> {"step", "value", "min", "max"}
Counters = dict[str, Any]  # name -> number, or {label: number} (one level, for Prometheus)
TelemetrySeries = dict[int, dict[str, list[float]]]  # rank -> {"time", "value"}
Hardware = dict[str, Any]  # see AggregatorProvider.hardware


def telemetry_metrics() -> dict[str, TelemetryMetric]:
    """The known telemetry metrics by name (units, Prometheus names, chart titles)."""
    return dict(_TELEMETRY_METRICS)


class StoredRun(TypedDict):
    """A run as the store knows it (history, whether or not it is live now)."""

    run: str
    world_size: int | None
    ranks: int
    first_time: float
    last_time: float
    records: int
    last_step: int | None


class StoredEvent(TypedDict):
    run: str
    rank: int
    seq: int
    time: float
    world_size: int | None
    host: str | None
    pid: int | None
    event: str
    step: int | None
    info: dict[str, Any]


class _LiveRunBase(TypedDict):
    run: str
    state: str
    world_size: int
    last_time: float | None
    last_step: int | None
    divergences: list[dict[str, Any]]


class LiveRun(_LiveRunBase, total=False):
    """A run in the live state. With ``ranks=True``: ``ranks`` (the rank entries of
    ``feed.rank_entry``); without: ``ranks_seen`` and the live ``metrics`` names."""

    ranks: list[dict[str, Any]]
    ranks_seen: int
    metrics: list[str]
    # With ``history=True``: the training's clock of the latest stored record, and, for stored
    # runs without live state, ``history: true`` and their first time, records and the count of
    # ranks whose records stop without an end or crash event.
    record_time: float | None
    history: bool
    first_time: float | None
    records: int | None
    ended_without_event: int


class Snapshot(TypedDict):
    now: float
    runs: list[LiveRun]


class DataProvider(Protocol):
    """What the dashboard reads and the one thing it writes (HTTP ingest)."""

    def list_runs(self) -> list[StoredRun]: ...

    def list_metrics(self, run: str) -> list[str]:
        """Stored metric names of ``run`` (the live ones are in the snapshot)."""
        ...

    def read_series(
        self,
        run: str,
        metric: str,
        *,
        ranks: Sequence[int] | None = None,
        start: int | None = None,
        end: int | None = None,
        max_points: int,
    ) -> SeriesColumns:
        """Each rank's points (every rank when ``ranks`` is None), at most ``max_points`` per
        rank, min/max downsampled."""
        ...

    def read_series_lists(
        self,
        run: str,
        metric: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int,
    ) -> SeriesLists:
        """``read_series`` of every rank as Python lists."""
        ...

    def read_band(
        self,
        run: str,
        metric: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int,
    ) -> Band:
        """The cross-rank band (median, p5, p95, min, max per step)."""
        ...

    def read_events(self, run: str) -> list[StoredEvent]: ...

    def read_latest_values(self, run: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """Each rank's stored value of ``metric`` at its newest step (ranks that stopped long
        before the others have none): (ranks, values), in rank order. The rank table of a
        stored run sorts by it; a live run's rank entries carry their own."""
        ...

    def read_stored_ranks(self, run: str) -> StoredRanks:
        """``run``'s stored ranks as columns, in rank order (a stored run's rank table of any
        size, without an entry per rank)."""
        ...

    def read_incidents(self, run: str) -> list[dict[str, Any]]:
        """Every incident of ``run`` (``Incident.as_dict()``), newest first, live or stored."""
        ...

    def read_commands(self, run: str) -> list[dict[str, Any]]:
        """Every command sent to ``run``'s ranks (``Issued.as_dict()``: who, when, the step,
        each rank's answer), newest first, live or stored."""
        ...

    def issue_command(
        self,
        run: str,
        kind: str,
        *,
        by: str,
        ranks: Sequence[int] | None = None,
        text: str = "",
        reason: str = "",
        incident: str = "",
    ) -> dict[str, Any]:
        """Send ``run``'s ranks a command (checkpoint, stop, note) at the next tick; the
        command as stored. ``incident``: the open incident it was asked from. ActionError for
        an unknown run, rank or incident, or nothing live."""
        ...

    def read_stacks(self, run: str) -> StackView:
        """The latest stack sample of each rank of ``run`` (live or stored) and their groups."""
        ...

    def snapshot(
        self,
        now: float | None = None,
        *,
        run: str | None = None,
        ranks: bool = True,
        history: bool = False,
    ) -> Snapshot:
        """The live state of every run (or of ``run``); ``ranks=False`` is cheap. ``history``:
        every stored run too, with its final state, newest first."""
        ...

    def status_snapshot(
        self,
        *,
        run: str | None = None,
        page: tuple[int, int] | None = None,
        history: bool = True,
    ) -> Snapshot:
        """``snapshot`` as ``/api/status``, ``/metrics`` and ``rankwatch status`` read it: a
        run of more than ``SUMMARY_RANKS`` ranks lists only its odd ranks (not alive,
        divergent, missing or dropping records; ``ranks_odd`` counts them) with
        ``rank_states`` (state -> count) and ``ranks_seen``; ``page`` (offset, limit, limit
        at most ``MAX_PAGE_RANKS``): each live run lists those of its ranks in rank order
        instead. Its cost grows with the ranks listed, not with the ranks."""
        ...

    def export_run(self, run: str, out_path: Path, fmt: str) -> int:
        """Write ``run``'s stored step rows to ``out_path`` as ``fmt`` (EXPORT_FORMATS); the
        number of rows. ExportError for an unknown run or format."""
        ...

    def alerts_firing(self) -> list[Alert]: ...

    def alerts_history(self, limit: int) -> list[Alert]:
        """The latest ``limit`` alert transitions."""
        ...

    def subscribe(self) -> Subscription:
        """A live feed subscription (``feed.py`` documents the messages)."""
        ...

    def ingest(self, records: Sequence[Record | StepBlock]) -> int:
        """Records from ``POST /api/ingest``; returns how many were new."""
        ...

    def counters(self) -> Counters: ...

    def list_telemetry(self, run: str) -> list[str]:
        """The telemetry metrics of ``run``, in the known table's order."""
        ...

    def read_telemetry(
        self,
        run: str,
        metric: str,
        *,
        ranks: Sequence[int] | None = None,
        start: float | None = None,
        end: float | None = None,
        max_points: int,
    ) -> TelemetrySeries:
        """rank -> {"time", "value"} of one telemetry metric (time-indexed, downsampled)."""
        ...

    def read_telemetry_band(
        self, run: str, metric: str, *, start: float | None = None, end: float | None = None,
        max_points: int,
    ) -> dict[str, list[float]]:  # fmt: skip
        """The cross-rank band of a telemetry metric over time (median, p5, p95, min, max)."""
        ...

    def hardware(self, run: str) -> Hardware:
        """The run's cards now: per-rank hardware columns, nodes, findings, leaders."""
        ...

    def export_telemetry(self, run: str, out_path: Path, fmt: str) -> int:
        """``run``'s telemetry as long rows; 0 (and no file) when it has none."""
        ...

    def telemetry_latest(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Every live run's cards: run -> rank -> {"host", "device", "values"} (/metrics)."""
        ...


class AggregatorProvider:
    """``DataProvider`` over a running ``Aggregator`` (its store, alert engine and feed)."""

    def __init__(self, aggregator: Aggregator) -> None:
        self._agg = aggregator

    def list_runs(self) -> list[StoredRun]:
        return self._agg.store.runs()  # type: ignore[return-value]

    def list_metrics(self, run: str) -> list[str]:
        return self._agg.store.metrics(run)

    def read_series(
        self,
        run: str,
        metric: str,
        *,
        ranks: Sequence[int] | None = None,
        start: int | None = None,
        end: int | None = None,
        max_points: int,
    ) -> SeriesColumns:
        return self._agg.store.series_columns(
            run, metric, ranks=ranks, start=start, end=end, max_points=max_points
        )

    def read_series_lists(
        self,
        run: str,
        metric: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int,
    ) -> SeriesLists:
        return self._agg.store.series(run, metric, start=start, end=end, max_points=max_points)

    def read_band(
        self,
        run: str,
        metric: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int,
    ) -> Band:
        return self._agg.store.band_columns(
            run, metric, start=start, end=end, max_points=max_points
        )

    def read_events(self, run: str) -> list[StoredEvent]:
        return self._agg.store.events(run)  # type: ignore[return-value]

    def read_latest_values(self, run: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        return self._agg.store.latest_values(run, metric)

    def read_stored_ranks(self, run: str) -> StoredRanks:
        return self._agg.stored_runs.columns(run)

    def read_incidents(self, run: str) -> list[dict[str, Any]]:
        return self._agg.incidents_of(run)

    def read_commands(self, run: str) -> list[dict[str, Any]]:
        return self._agg.commands_of(run)

    def issue_command(
        self,
        run: str,
        kind: str,
        *,
        by: str,
        ranks: Sequence[int] | None = None,
        text: str = "",
        reason: str = "",
        incident: str = "",
    ) -> dict[str, Any]:
        return self._agg.issue_command(run, kind, by=by, ranks=ranks, text=text, reason=reason,
                                       incident=incident)  # fmt: skip

    def read_stacks(self, run: str) -> StackView:
        agg = self._agg
        return stack_view(run, agg.stacks.latest(run, agg.store.stacks(run)))

    def snapshot(
        self,
        now: float | None = None,
        *,
        run: str | None = None,
        ranks: bool = True,
        history: bool = False,
    ) -> Snapshot:
        snap = self._agg.snapshot(now, run=run, ranks=ranks, history=history)
        return snap  # type: ignore[return-value]

    def status_snapshot(
        self,
        *,
        run: str | None = None,
        page: tuple[int, int] | None = None,
        history: bool = True,
    ) -> Snapshot:
        snap = self._agg.snapshot(run=run, history=history, summary=True, page=page)
        return snap  # type: ignore[return-value]

    def export_run(self, run: str, out_path: Path, fmt: str) -> int:
        return export_run(self._agg.store, run, out_path, fmt)

    def alerts_firing(self) -> list[Alert]:
        return self._agg.alerts.firing()

    def alerts_history(self, limit: int) -> list[Alert]:
        return self._agg.alerts.history(limit)

    def subscribe(self) -> Subscription:
        return self._agg.feed.subscribe()

    def ingest(self, records: Sequence[Record | StepBlock]) -> int:
        return self._agg.add(records)

    def counters(self) -> Counters:
        return self._agg.counters()

    def list_telemetry(self, run: str) -> list[str]:
        agg = self._agg
        with agg.lock:
            card_names = {n for c in agg.telemetry.watch.cards.get(run, {}).values()
                          for n in c.values}  # fmt: skip
        return sorted(card_names | set(agg.store.telemetry_names(run)), key=order_key)

    def read_telemetry(
        self,
        run: str,
        metric: str,
        *,
        ranks: Sequence[int] | None = None,
        start: float | None = None,
        end: float | None = None,
        max_points: int,
    ) -> TelemetrySeries:
        return self._agg.store.telemetry_series(
            run, metric, ranks=ranks, start=start, end=end, max_points=max_points
        )

    def read_telemetry_band(
        self, run: str, metric: str, *, start: float | None = None, end: float | None = None,
        max_points: int,
    ) -> dict[str, list[float]]:  # fmt: skip
        return self._agg.store.telemetry_band(run, metric, start, end, max_points)

    def hardware(self, run: str) -> Hardware:
        agg = self._agg
        with agg.lock:
            view = hw_cards.hardware_view(agg.telemetry.watch, agg.telemetry.findings, run)
        if not view["ranks"]:  # not live: the latest values the store holds
            store = agg.store
            stored = hw_cards.stored_rows(store.telemetry_latest(run), store.telemetry_hosts(run))
            view = {**view, **hw_cards.nodes_of(stored)}
        return view

    def telemetry_latest(self) -> dict[str, dict[int, dict[str, Any]]]:
        agg = self._agg
        with agg.lock:
            return {
                run: {rank: {"host": c.host, "device": c.device, "values": dict(c.values)}
                      for rank, c in cards.items()}
                for run, cards in agg.telemetry.watch.cards.items()
            }  # fmt: skip

    def export_telemetry(self, run: str, out_path: Path, fmt: str) -> int:
        return export_telemetry(self._agg.store, run, out_path, fmt)
