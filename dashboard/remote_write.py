"""Push the ``/metrics`` exposition to a time-series store on a timer: fleet-wide views and long
retention beyond one head node, off by default (``serve --remote-write URL``).

The body is the Prometheus text format, the same bytes a scrape of ``/metrics`` gets, POSTed to
``URL``. VictoriaMetrics takes it at ``/api/v1/import/prometheus`` (single node) and its cluster
at ``/insert/<tenant>/prometheus/api/v1/import/prometheus`` on any vminsert, which spreads the
series over its storage nodes; a push gateway takes it too. The store stamps each sample with
the time it arrives, so a push every ``interval_s`` is a sample every ``interval_s``.

A store that is down costs nothing but a counter: one line when pushes start failing, one when
they work again, never a backlog (the next push carries the current values).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_INTERVAL_S = 10.0
TIMEOUT_S = 5.0
_HEADERS = {"Content-Type": "text/plain; version=0.0.4", "User-Agent": "rankwatch-serve"}


@dataclass
class PushCounts:
    pushes: int = 0
    failures: int = 0
    last_error: str = ""


class RemoteWriter:
    """A daemon thread that POSTs ``render()`` to ``url`` every ``interval_s`` seconds."""

    def __init__(
        self,
        url: str,
        render: Callable[[], str],
        interval_s: float = DEFAULT_INTERVAL_S,
        say: Callable[[str], None] = print,
    ) -> None:
        self.url = url  # checked with the rest of the config (aggregator/config.py)
        self.interval_s = interval_s
        self.counts = PushCounts()
        self._render = render
        self._say = say
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="rankwatch-remote-write", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after one last push, so the store holds the final state of every run."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=TIMEOUT_S + 1)

    def push(self) -> bool:
        """One push now; True when the store took it."""
        request = urllib.request.Request(
            self.url, data=self._render().encode(), headers=_HEADERS, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            error = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else str(exc)
            if isinstance(exc, urllib.error.HTTPError):
                exc.close()
            if not self.counts.last_error:
                self._say(f"rankwatch: remote write to {self.url} failed: {error} (retrying)")
            self.counts.failures += 1
            self.counts.last_error = error
            return False
        if self.counts.last_error:
            self._say(f"rankwatch: remote write to {self.url} works again")
            self.counts.last_error = ""
        self.counts.pushes += 1
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.push()
        self.push()
