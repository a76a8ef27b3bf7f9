"""The console sink: one line per alert transition, local time first (stderr by default)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from rankwatch.aggregator.alerts.sinks.base import CLOSE_TIMEOUT_S
from rankwatch.aggregator.alerts.sinks.words import alert_dict, alert_line, change_action
from rankwatch.aggregator.incidents.model import IncidentChange
from rankwatch.aggregator.incidents.words import dashboard_link, title


def format_alert(alert: Any) -> str:
    a = alert_dict(alert)
    when = a.get("time")
    stamp = time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(when if isinstance(when, (int, float)) else None)
    )
    return f"{stamp} rankwatch {alert_line(a)}"


class ConsoleSink:
    name = "console"

    def __init__(self, stream: TextIO | None = None, public_url: str | None = None) -> None:
        self._stream = stream
        self.public_url = public_url  # the dashboard's address: incident lines end with a link
        self._lock = threading.Lock()
        self.printed = 0
        self.failed = 0

    def submit_incident(self, change: IncidentChange) -> None:
        """One line a person reads first: what broke, on which rank, why; what was done about
        it (or that nothing was)."""
        inc = change.incident
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(inc.updated))
        link = f" {dashboard_link(self.public_url, inc)}" if self.public_url else ""
        action = change_action(change, self.public_url)
        done = f" | {action['line']}" if action is not None else ""
        self._write(f"{stamp} rankwatch {title(change)}: {inc.summary}{done}{link}")

    def submit(self, alert: Any) -> None:
        self._write(format_alert(alert))

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stderr
        with self._lock:
            try:
                stream.write(line + "\n")
                stream.flush()
                self.printed += 1
            except (OSError, ValueError):  # closed or broken terminal: alerts still go elsewhere
                self.failed += 1

    __call__ = submit

    def snapshot(self) -> dict[str, Any]:
        return {"printed": self.printed, "failed": self.failed}

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        pass  # nothing queued: every line is written when it is submitted
