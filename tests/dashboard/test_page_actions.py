"""The run's stop button in real headless Chromium: with `serve --token` the confirmation names
the run and its live ranks, every rank stops after one step and the press is in the commands
history; without a token the server refuses and the page says why, and nothing stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from rankwatch.agent.monitor import Monitor

from .procs import Server
from .test_browser import CHROMIUM, CHROMIUM_ARGS, READY_TIMEOUT_MS

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the skip below says why
    sync_playwright = None

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]

TOKEN = "page-actions-token"
WORLD = 2


class Loop(threading.Thread):
    """A training loop with a real Monitor that accepts stop; steps every 50 ms."""

    def __init__(self, server: Server, run: str, rank: int, log_dir: Path) -> None:
        super().__init__(daemon=True)
        self.mon = Monitor(run=run, rank=rank, world_size=WORLD, addr=server.ingest,
                           log_dir=log_dir, accept="stop", heartbeat_s=1.0)  # fmt: skip
        self.stopped: int | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        step = 0
        while not self.halt.wait(0.05):
            step += 1
            self.mon.log(step, loss=1.0 / step)
            if self.mon.should_stop(step):
                self.stopped = step
                break
        self.mon.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def press_stop(
    browser: Browser, server: Server, run: str, token: str | None
) -> tuple[Page, list[str]]:
    page = browser.new_context().new_page()
    dialogs: list[str] = []

    def accept(dialog: object) -> None:
        dialogs.append(dialog.message)  # type: ignore[attr-defined]
        dialog.accept()  # type: ignore[attr-defined]

    page.on("dialog", accept)
    query = f"?token={token}" if token else ""
    page.goto(f"{server.url}/{query}#run={quote(run, safe='')}")
    page.wait_for_function("() => window.rankwatch && window.rankwatch.ready",
                           timeout=READY_TIMEOUT_MS)  # fmt: skip
    page.click("#actions button[data-cmd=stop]")
    return page, dialogs


def result(page: Page, words: str) -> str:
    page.wait_for_function(
        "(w) => document.getElementById('action-result').textContent.includes(w)", arg=words,
        timeout=30_000,
    )  # fmt: skip
    return str(page.evaluate("() => document.getElementById('action-result').textContent"))


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
def test_stop_from_the_page(browser: Browser, tmp_path: Path, token: str | None) -> None:
    server = Server(tmp_path / "data", token=token)
    run = f"page-stop-{'token' if token else 'open'}"
    loops = [Loop(server, run, rank, tmp_path / "logs") for rank in range(WORLD)]
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(path: str) -> dict:
        res = httpx.get(f"{server.url}{path}", params={"run": run}, headers=headers, timeout=10)
        res.raise_for_status()
        return res.json()

    try:
        for loop in loops:
            loop.start()
        server.wait_for("both ranks", lambda: len(get("/api/run/ranks")["ranks"]) == WORLD)
        page, dialogs = press_stop(browser, server, run, token)
        if token is None:
            said = result(page, "refused")
            assert "need a token" in said and "--token" in said
            time.sleep(1.0)
            assert all(loop.stopped is None for loop in loops)  # nothing stopped
            assert get("/api/run/commands")["commands"] == []
            return
        said = result(page, f"{WORLD} done")  # the confirmation came first
        assert dialogs == [f'Stop run "{run}" on its {WORLD} live rank(s) after the next agreed '
                           "step: every rank finishes that step, then training ends?"]  # fmt: skip
        assert said.startswith("stop at step ")
        for loop in loops:
            loop.join(15)
        (stopped,) = {loop.stopped for loop in loops}
        assert stopped is not None and said == f"stop at step {stopped}: {WORLD} done"
        (command,) = get("/api/run/commands")["commands"]
        assert command["by"] == "page (127.0.0.1)" and command["reason"] == "pressed on the page"
    finally:
        for loop in loops:
            loop.halt.set()
            loop.join(10)
        server.stop()
