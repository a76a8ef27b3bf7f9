"""Reading the live stream (``/api/stream``) from a benchmark: when each step first arrived."""

from __future__ import annotations

import json
import threading
import time

import httpx


def step_arrivals(
    url: str,
    run: str,
    metric: str,
    out: dict[int, float],
    stop: threading.Event,
    ready: threading.Event | None = None,
) -> None:
    """First arrival (wall time) of each step of ``metric`` of ``run``, into ``out``, until
    ``stop``; ``ready`` is set once the stream is open."""
    with (
        httpx.Client(timeout=None) as client,
        client.stream("GET", f"{url}/api/stream", params={"run": run}) as res,
    ):
        if ready is not None:
            ready.set()
        event = ""
        for line in res.iter_lines():
            now = time.time()
            if stop.is_set():
                return
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "feed":
                for msg in json.loads(line[5:]):
                    if msg.get("type") == "points" and msg.get("metric") == metric:
                        for _, step, _ in msg["points"]:
                            out.setdefault(step, now)
