"""Shared fixtures for the dashboard tests: a real Aggregator over a real store in tmp_path."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Starlette >= 1.x warns at import time when its TestClient runs on httpx rather than httpx2;
# pytest turns warnings into errors, so take the import here once, with that one warning off.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2` instead")
    import starlette.testclient  # noqa: F401

from rankwatch.agent.wire.records import EventRecord, StepRecord

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHIFTED = FIXTURES / "msrun4_rank2_labels_shifted_from_step20.csv"
STEP_S = 0.01  # wall-clock seconds between synthetic steps
# TestClient's own default host ("testserver") is a name the app does not answer to
BASE_URL = "http://localhost"

# The page tests: real headless Chromium through playwright, skipped where either is missing.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

# Each column of the rank table scrolled into its box (the box scrolls sideways where the table
# is wider, as a swipe would): is its header and its first row's cell then inside the box and
# the screen, clear of the rank column kept at the left, and is that rank column still there?
# (The first row shown: a phone's table hides the ranks that do not matter.)
TABLE_COLUMNS_JS = """() => {
  const wrap = document.getElementById('rank-wrap');
  const rows = [...document.querySelectorAll('#rank-body tr')];
  const row = rows.find((r) => r.getClientRects().length);
  const within = (r, lo, hi) => r.width > 0 && r.left >= lo - 0.5 && r.right <= hi + 0.5;
  const out = [...document.querySelectorAll('#rank-head th')].map((th, i) => {
    const td = row.children[i];
    wrap.scrollLeft = Math.max(0, th.offsetLeft + th.offsetWidth - wrap.clientWidth);
    const box = wrap.getBoundingClientRect();
    const rank = row.children[0].getBoundingClientRect();
    const lo = Math.max(box.left, 0, i ? rank.right : 0);
    const hi = Math.min(box.right, innerWidth);
    const head = th.getBoundingClientRect();
    const cell = td.getBoundingClientRect();
    return {
      head: th.textContent, cell: td.innerText, rank: row.children[0].innerText,
      shown: within(head, lo, hi) && within(cell, lo, hi),
      rankShown: within(rank, Math.max(box.left, 0), hi),
    };
  });
  wrap.scrollLeft = 0;
  return out;
}"""

try:
    from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright
except ImportError:  # pragma: no cover - BROWSER_MARKS skip the page tests
    sync_playwright = None
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


class Records:
    """Builds wire records with per-rank sequence numbers, as agents would."""

    def __init__(self) -> None:
        self.seq: dict[tuple[str, int], int] = {}
        # Recent, like live traffic: the aggregator keeps old imported history out of the
        # live state (health, divergence, alerts), and these records stand for a live run.
        self.t0 = time.time() - 60.0

    def _next(self, run: str, rank: int) -> int:
        self.seq[(run, rank)] = self.seq.get((run, rank), 0) + 1
        return self.seq[(run, rank)]

    def step(
        self,
        run: str,
        rank: int,
        step: int,
        world_size: int,
        t: float | None = None,
        **metrics: float,
    ) -> StepRecord:
        return StepRecord(
            run=run,
            rank=rank,
            seq=self._next(run, rank),
            time=self.t0 + step * STEP_S if t is None else t,
            world_size=world_size,
            host=f"node{rank // 8}",
            pid=1000 + rank,
            step=step,
            epoch=None,
            metrics=metrics,
        )

    def event(
        self, run: str, rank: int, kind: str, step: int | None, world_size: int, **info: Any
    ) -> EventRecord:
        return EventRecord(
            run=run,
            rank=rank,
            seq=self._next(run, rank),
            time=self.t0 + (step or 0) * STEP_S,
            world_size=world_size,
            host=f"node{rank // 8}",
            pid=1000 + rank,
            event=kind,
            step=step,
            info=info,
        )


def fixture_rows(path: Path = SHIFTED) -> list[tuple[int, int, float]]:
    with path.open() as f:
        return [(int(r["step"]), int(r["rank"]), float(r["loss"])) for r in csv.DictReader(f)]


@pytest.fixture
def recs() -> Records:
    return Records()


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[Any]:
    from rankwatch.aggregator.service import Aggregator, ServeConfig

    config = ServeConfig(
        data_dir=tmp_path / "data",
        ingest_host="127.0.0.1",
        ingest_port=0,
        console_alerts=False,
        resend_gaps=False,
    )
    agg = Aggregator(config)
    yield agg
    agg.stop()


def settle(agg: Any) -> None:
    """What the service threads do every tick: publish, alert, write the store."""
    agg.tick()
    assert agg.flush_store()


def feed_shifted_run(agg: Any, recs: Records, run: str = "msrun4") -> None:
    """The real 4-rank msrun trace where rank 2's labels go bad from step 20."""
    batch = [recs.event(run, rank, "start", None, 4) for rank in range(4)]
    for step, rank, loss in fixture_rows():
        batch.append(recs.step(run, rank, step, 4, loss=loss, lr=0.01))
    agg.add(batch)
    settle(agg)


def finite_or_str(values: list[Any]) -> list[float]:
    return [
        v if isinstance(v, (int, float)) else {"NaN": math.nan}.get(v, math.inf) for v in values
    ]


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """Where the page tests leave screenshots and logs for a person to look at."""
    path = Path(os.environ.get("RANKWATCH_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[Browser]:
    """One Chromium per test module. A module's ``server`` fixture, where the test uses one,
    is set up first, so the browser (and the streams its pages hold open) closes before the
    server stops."""
    if "server" in request.fixturenames:
        request.getfixturevalue("server")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Watched:
    """A page with every dialog and page error recorded (an XSS would show up here). Dialogs
    are dismissed, or accepted where the test presses a button that asks for confirmation."""

    def __init__(self, page: Page, accept_dialogs: bool = False) -> None:
        self.page = page
        self.accept_dialogs = accept_dialogs
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        if self.accept_dialogs:
            dialog.accept()
        else:
            dialog.dismiss()


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Callable[..., Watched]]:
    """``new_page(viewport, accept_dialogs=False)``: a page in a context of its own, at that
    size; every context the test opened is closed after it."""
    contexts: list[BrowserContext] = []

    def make(viewport: dict[str, int] = DESKTOP, accept_dialogs: bool = False) -> Watched:
        context = browser.new_context(viewport=viewport)
        contexts.append(context)
        return Watched(context.new_page(), accept_dialogs)

    yield make
    for context in contexts:
        context.close()


def resize(page: Page, size: dict[str, int]) -> None:
    """Resize the window and wait for the charts to follow: the page redraws them after a
    debounced resize event, so a fixed pause can race it on a loaded machine. The page that
    never fits is left for the caller's own layout check to describe."""
    from playwright.sync_api import TimeoutError as PageTimeout

    page.set_viewport_size(size)
    with contextlib.suppress(PageTimeout):  # the caller's check says what is wrong
        page.wait_for_function(
            "() => document.documentElement.scrollWidth <= innerWidth", timeout=5_000
        )
    page.wait_for_timeout(200)  # past the debounce, so a second redraw has landed too
