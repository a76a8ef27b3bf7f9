"""`servers`: start `rankwatch serve` processes that are killed when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cli.running import Server


@pytest.fixture
def servers() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*args: Any, **kw: Any) -> Server:
        server = Server(*args, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()
