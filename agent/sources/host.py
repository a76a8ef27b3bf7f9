"""``host``: the node and this rank process, through psutil (imported on the first sample, on
the sampler thread, never at ``import rankwatch.agent``).

Values: ``cpu_pct`` (the whole host, since the previous sample), ``proc_cpu_pct`` (this process,
100 per busy core), ``rss_bytes``, ``mem_available_bytes``, ``load1``, ``disk_free_log_bytes``
(the JSONL folder's file system), ``disk_free_ckpt_bytes`` (the checkpoint folder's, when one is
given: ``Monitor(ckpt_dir=...)`` or ``RANKWATCH_CKPT_DIR``) and ``net_rx_bytes_per_s`` /
``net_tx_bytes_per_s`` (all interfaces but loopback). Rates need two samples: the first sample
leaves them out. A folder that is gone is left out of that sample, not fatal.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from .base import INTERVAL_S, SourceError


class HostSource:
    name = "host"

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        *,
        log_dir: str | os.PathLike[str] | None = None,
        ckpt_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._dirs = {"log": log_dir, "ckpt": ckpt_dir}
        self._psutil: Any = None
        self._proc: Any = None
        self._net: tuple[float, int, int] | None = None  # (monotonic time, rx, tx) last sample

    def _start(self) -> Any:
        try:
            import psutil
        except ImportError:
            raise SourceError(
                "telemetry source 'host' needs psutil, which is not installed "
                "(pip install psutil); host values are not sent"
            ) from None
        self._proc = psutil.Process()
        # The first cpu_percent() calls only set the reference point (they return 0.0).
        psutil.cpu_percent(None)
        self._proc.cpu_percent(None)
        self._psutil = psutil
        return psutil

    def sample(self, now: float) -> dict[str, float]:
        psutil = self._psutil or self._start()
        first = self._net is None
        out: dict[str, float] = {}
        if not first:
            out["cpu_pct"] = float(psutil.cpu_percent(None))
            out["proc_cpu_pct"] = float(self._proc.cpu_percent(None))
        out["rss_bytes"] = float(self._proc.memory_info().rss)
        out["mem_available_bytes"] = float(psutil.virtual_memory().available)
        out["load1"] = float(os.getloadavg()[0]) if hasattr(os, "getloadavg") else float("nan")
        for kind, folder in self._dirs.items():
            free = _free_bytes(folder)
            if free is not None:
                out[f"disk_free_{kind}_bytes"] = free
        counters = psutil.net_io_counters(pernic=True)
        rx = sum(c.bytes_recv for nic, c in counters.items() if nic != "lo")
        tx = sum(c.bytes_sent for nic, c in counters.items() if nic != "lo")
        at = time.monotonic()
        if self._net is not None and at > self._net[0]:
            elapsed = at - self._net[0]
            # a counter that went back (an interface gone) reads as no traffic, not negative
            out["net_rx_bytes_per_s"] = max(0, rx - self._net[1]) / elapsed
            out["net_tx_bytes_per_s"] = max(0, tx - self._net[2]) / elapsed
        self._net = (at, rx, tx)
        return out


def _free_bytes(folder: str | os.PathLike[str] | None) -> float | None:
    if folder is None:
        return None
    path = Path(folder)
    for candidate in (path, *path.parents):  # a folder not made yet: the disk it will be on
        try:
            return float(shutil.disk_usage(candidate).free)  # what a non-root writer may use
        except OSError:
            continue
    return None
