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
) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s:g} s")
        time.sleep(every_s)
