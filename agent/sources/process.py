"""``process``: this rank process's resident memory and CPU time (Linux ``/proc``, stdlib only)."""

from __future__ import annotations

import os

INTERVAL_S = 10.0
STATM = "/proc/self/statm"  # fields in pages: size resident shared text lib data dt


class ProcessSource:
    """``rss_bytes`` (resident set), ``cpu_s`` (user + system CPU seconds since the process
    started) and ``cpu_cores`` (CPU seconds per wall second since the previous sample)."""

    name = "process"

    def __init__(self, interval_s: float = INTERVAL_S, statm: str = STATM) -> None:
        self.interval_s = interval_s
        self._statm = statm
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._prev: tuple[float, float] | None = None  # (now, cpu_s) of the previous sample

    def sample(self, now: float) -> dict[str, float]:
        with open(self._statm, "rb") as f:
            resident = int(f.read().split()[1])
        t = os.times()
        cpu = t.user + t.system
        out = {"rss_bytes": float(resident * self._page), "cpu_s": cpu}
        prev, self._prev = self._prev, (now, cpu)
        if prev is not None and now > prev[0]:
            out["cpu_cores"] = (cpu - prev[1]) / (now - prev[0])
        return out
