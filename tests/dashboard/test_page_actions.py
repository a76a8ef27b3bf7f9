"""The run's stop button and the open incident card's buttons in real headless Chromium: with
`serve --token` the confirmation names the run and its live ranks, a checkpoint pressed on the
card is done on every rank and is in the commands history with its incident, and the run's stop
makes every rank stop after one step; without a token the server refuses both and the page says
why, and nothing stops. Screenshots of the card with its buttons (desktop and phone) go to
test-artifacts/ (or $RANKWATCH_ARTIFACTS): actions-card-desktop.png, actions-card-phone.png, and
actions-card-pressed.png once the checkpoint pressed there is done, actions-card-refused.png
without a token."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx
import pytest
from rankwatch.agent.monitor import Monitor

from .conftest import BROWSER_MARKS, DESKTOP, PHONE, Watched, resize
from .procs import Server
from .test_browser import READY_TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = BROWSER_MARKS

TOKEN = "page-actions-token"
WORLD = 2
NAN_FROM = 3  # rank 1's loss is NaN from this step on: an open incident, with its card
SIZES = {"desktop": DESKTOP, "phone": PHONE}
CARD_BUTTONS = "#incident button.inc-cmd"
# No command button shown, on the card or beside the run's name.
OVER_JS = """() => [...document.querySelectorAll('#incident .inc-cmd, #actions button[data-cmd]')]
  .every((b) => b.offsetParent === null)"""


class Loop(threading.Thread):
    """A training loop with a real Monitor that accepts checkpoint and stop; steps every 50 ms;
    rank 1 goes NaN at ``NAN_FROM``."""

    def __init__(self, server: Server, run: str, rank: int, log_dir: Path) -> None:
        super().__init__(daemon=True)
        self.mon = Monitor(run=run, rank=rank, world_size=WORLD, addr=server.ingest,
                           log_dir=log_dir, accept="checkpoint,stop",
                           heartbeat_s=1.0)  # fmt: skip
        self.saved: list[int] = []
        self.mon.on("checkpoint", lambda step: self.saved.append(step))
        self.rank = rank
        self.stopped: int | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        step = 0
        while not self.halt.wait(0.05):
            step += 1
            nan = self.rank == 1 and step >= NAN_FROM
            self.mon.log(step, loss=math.nan if nan else 1.0 / step)
            if self.mon.should_stop(step):
                self.stopped = step
                break
        self.mon.close()


def open_page(
    new_page: Callable[..., Watched], server: Server, run: str, token: str | None
) -> tuple[Page, list[str]]:
    w = new_page(DESKTOP, accept_dialogs=True)  # the confirmations are read, then accepted
    page, dialogs = w.page, w.dialogs
    query = f"?token={token}" if token else ""
    page.goto(f"{server.url}/{query}#run={quote(run, safe='')}")
    page.wait_for_function("() => window.rankwatch && window.rankwatch.ready",
                           timeout=READY_TIMEOUT_MS)  # fmt: skip
    page.wait_for_selector(CARD_BUTTONS, timeout=30_000)  # the open incident's card
    return page, dialogs


def result(page: Page, words: str, where: str = "action-result") -> str:
    page.wait_for_function(
        "([id, w]) => document.getElementById(id).textContent.includes(w)", arg=[where, words],
        timeout=30_000,
    )  # fmt: skip
    return str(page.evaluate("(id) => document.getElementById(id).textContent", where))


def shoot_card(page: Page, artifacts: Path) -> None:
    """The card with its buttons at both sizes: the card no wider than the screen, both buttons
    on it and coloured apart from the card's harmless "show step" button."""
    for name, size in SIZES.items():
        resize(page, size)
        got = page.evaluate(
            """(sel) => ({wide: Math.max(document.getElementById('incident').scrollWidth,
                   document.getElementById('incident').getBoundingClientRect().right),
                 inner: innerWidth,
                 buttons: [...document.querySelectorAll(sel)].map((b) => {
                   const r = b.getBoundingClientRect(), s = getComputedStyle(b);
                   return [b.textContent, r.right <= innerWidth, s.backgroundColor]; }),
                 harmless: getComputedStyle(document.querySelector('#incident .inc-go'))
                   .backgroundColor})""",
            CARD_BUTTONS,
        )  # fmt: skip
        assert got["wide"] <= got["inner"], (name, got)
        assert [b[0] for b in got["buttons"]] == ["checkpoint now", "stop at the next step"]
        assert all(b[1] for b in got["buttons"]), (name, got)
        assert all(b[2] != got["harmless"] for b in got["buttons"]), (name, got)
        page.locator("#incident").screenshot(path=str(artifacts / f"actions-card-{name}.png"))
    page.set_viewport_size(DESKTOP)


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
def test_stop_from_the_page(
    new_page: Callable[..., Watched], tmp_path: Path, token: str | None, artifacts: Path
) -> None:
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
        path = f"/api/runs/{quote(run, safe='')}/incidents"
        (incident,) = server.wait_for("the NaN incident", lambda: [
            i for i in get(path)["incidents"] if i["state"] == "firing"])  # fmt: skip
        page, dialogs = open_page(new_page, server, run, token)
        if token is None:
            page.click(f"{CARD_BUTTONS}.stop")
            said = result(page, "refused", "inc-action-result")
            assert "need a token" in said and "--token" in said
            page.locator("#incident").screenshot(path=str(artifacts / "actions-card-refused.png"))
            page.click("#actions button[data-cmd=stop]")
            said = result(page, "refused")
            assert "need a token" in said and "--token" in said
            time.sleep(1.0)
            assert all(loop.stopped is None for loop in loops)  # nothing stopped
            assert get("/api/run/commands")["commands"] == []
            return
        shoot_card(page, artifacts)
        page.click(f"{CARD_BUTTONS}.checkpoint")
        said = result(page, f"{WORLD} done", "inc-action-result")
        assert said.startswith("checkpoint at step ")
        page.locator("#incident").screenshot(path=str(artifacts / "actions-card-pressed.png"))
        (ckpt,) = get("/api/run/commands")["commands"]
        assert ckpt["incident"] == incident["id"] and ckpt["cmd"] == "checkpoint"
        assert ckpt["by"] == "page (127.0.0.1)"
        assert ckpt["reason"] == f"pressed on the card of incident {incident['id']}"
        assert all(loop.saved == [ckpt["step"]] for loop in loops)
        assert all(loop.stopped is None for loop in loops)  # a checkpoint: training goes on
        page.click("#actions button[data-cmd=stop]")
        said = result(page, f"{WORLD} done")  # the confirmation came first
        assert dialogs == [
            f'Checkpoint run "{run}" on its {WORLD} live rank(s) at the end of the next agreed '
            f"step; training goes on? (from incident {incident['id']})",
            f'Stop run "{run}" on its {WORLD} live rank(s) after the next agreed '
            "step: every rank finishes that step, then training ends?",
        ]  # fmt: skip
        assert said.startswith("stop at step ")
        for loop in loops:
            loop.join(15)
        (stopped,) = {loop.stopped for loop in loops}
        assert stopped is not None and said == f"stop at step {stopped}: {WORLD} done"
        command, _ = get("/api/run/commands")["commands"]  # newest first
        assert command["by"] == "page (127.0.0.1)" and command["reason"] == "pressed on the page"
        assert command["incident"] == ""
        # the card shows what was done from it, with the ranks' answers
        page.wait_for_function(
            "(w) => document.getElementById('incident').textContent.includes(w)",
            arg=f"action: checkpoint at step {ckpt['step']} by page (127.0.0.1): {WORLD} done",
            timeout=10_000,
        )  # fmt: skip
        # Every rank stopped: the run is over, so neither the card nor the run offers a command
        # the server would refuse, and the stop's outcome stays beside the run's name.
        server.wait_for(
            "the run to finish",
            lambda: (
                [r["state"] for r in get("/api/runs")["runs"] if r["run"] == run] == ["finished"]
            ),
        )
        page.wait_for_function(OVER_JS, timeout=10_000)
        assert "FIRING" not in page.inner_text("#incident")
        assert page.inner_text("#action-result") == said
        page.locator("#incident").screenshot(path=str(artifacts / "actions-card-ended.png"))
    finally:
        for loop in loops:
            loop.halt.set()
            loop.join(10)
        server.stop()
