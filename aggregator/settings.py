"""How the aggregator runs: ``ServeConfig`` (the TOML file and ``rankwatch serve``'s flags
resolve to it, see config.py), the periods and bounds of the service loop, and the collector
tuning for ingest."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

from rankwatch.agent.wire.addresses import DEFAULT_HTTP_PORT, DEFAULT_INGEST_PORT
from rankwatch.aggregator.actions.policy import Rule
from rankwatch.aggregator.alerts.config import AlertConfig
from rankwatch.aggregator.alerts.sinks.http import WebhookConfig
from rankwatch.aggregator.divergence.detector import DivergenceConfig
from rankwatch.aggregator.health import DEFAULT_MIN_STALL_S
from rankwatch.aggregator.incidents.tracker import IncidentConfig
from rankwatch.aggregator.telemetry.outliers import HardwareConfig

DEFAULT_DATA_DIR = "rankwatch_data"
DEFAULT_PORT = DEFAULT_HTTP_PORT
FLUSH_INTERVAL_S = 0.2  # tick period: live feed, divergence, health (dashboard latency)
# Store flush period. A flush has a fixed CPU cost however few rows it writes (rollups, band), so
# it runs less often than the tick; the live view never waits for it, and a rank's JSONL plus
# resend cover what a killed aggregator had not flushed yet.
STORE_FLUSH_S = 0.5
STORE_FLUSH_MAX_S = 2.0  # ... and a buffer of many ranks waits up to this long (store/flusher.py)
STORE_BACKLOG_RECORDS = 100_000  # this many buffered after a flush: flush again at once
STORE_RETRY_S = 5.0  # after a failed flush, wait this long before writing again
HEALTH_EVERY_S = 1.0  # rank health is evaluated again at least this often (see tick)
RANKS_REFRESH_S = 2.0  # rank tables are re-sent this often even without a state change
MAX_FEED_POINTS = 20_000  # points per tick on the live feed; beyond, records are sampled
LIVE_RETENTION_S = 6 * 3600.0  # a run over (finished, crashed, lost) this long leaves the
# live state; the store and the dashboard's run list keep it
IMPORT_LIVE_WINDOW_S = 600.0  # imported records newer than this also update the live state
STOP_TIMEOUT_S = 5.0
SINK_CLOSE_S = 2.0  # all alert sinks together, at stop: a hung webhook is abandoned after it
GC_THRESHOLDS = (20_000, 20, 20)  # young collections every 20,000 allocations (default 700)
RECORD_COUNTERS = ("received", "accepted", "duplicates", "imported")
INGEST_COUNTERS = ("messages", "records", "bad_messages", "bad_records", "connections",
                   "disconnects", "refused", "handshake_incomplete", "routes_evicted",
                   "peer_ranks_capped", "bytes", "frames_rejected", "backlog_dropped",
                   "backlog_full", "backlog_bytes", "peer_buffer_bytes")  # fmt: skip


@dataclasses.dataclass
class ServeConfig:
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    host: str = "127.0.0.1"  # dashboard
    port: int = DEFAULT_PORT
    ingest_host: str = "*"  # agents
    ingest_port: int = DEFAULT_INGEST_PORT
    token: str | None = None
    alerts: AlertConfig = dataclasses.field(default_factory=AlertConfig)
    divergence: DivergenceConfig = dataclasses.field(default_factory=DivergenceConfig)
    telemetry: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)
    webhooks: list[WebhookConfig] = dataclasses.field(default_factory=list)
    incidents: IncidentConfig = dataclasses.field(default_factory=IncidentConfig)
    public_url: str | None = None  # the dashboard as people reach it: incident messages link it
    flush_interval_s: float = FLUSH_INTERVAL_S
    store_flush_s: float = STORE_FLUSH_S
    store_flush_max_s: float = STORE_FLUSH_MAX_S
    store_backlog_records: int = STORE_BACKLOG_RECORDS
    lost_after_s: float = 10.0
    min_stall_s: float = DEFAULT_MIN_STALL_S  # a rank is stalled after no step for at least this
    merge_grace_s: float = 5.0
    console_alerts: bool = True
    resend_gaps: bool = True  # ask agents to re-send missing seqs from their JSONL
    curve_dir: Path | None = None  # CurveZMQ key files (`rankwatch keys`): encrypted ingest
    allow_hosts: tuple[str, ...] = ()  # names the dashboard answers to besides IPs, localhost
    remote_write: str | None = None  # push /metrics here (dashboard/remote_write.py); off: None
    remote_write_interval_s: float = 10.0
    policies: tuple[Rule, ...] = ()  # [[policy]] / --policy: incidents -> actions (actions/)

    def __repr__(self) -> str:  # never print the token
        token = "set" if self.token else None
        return f"ServeConfig(data_dir={self.data_dir!s}, port={self.port}, token={token})"


def tune_gc() -> None:
    """Set the collector up for ingest (process-wide; ``rankwatch serve`` calls it once the
    aggregator is built). Ingest makes many short-lived objects: moving what start-up built
    out of the collector's way and collecting less often saves much of the ingest thread's
    CPU per record (figures: docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
