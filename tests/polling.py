"""Waiting on real processes and sockets without fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float = 10.0,
    every_s: float = 0.02,
    what: str = "condition",
    detail: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that value; fail
    naming ``what`` (and what ``detail()`` says about the state at that moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{more}")
        time.sleep(every_s)
