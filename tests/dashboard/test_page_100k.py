"""The page at 100,000 ranks in real headless Chromium, against a real `rankwatch serve` over a
real store filled once for the module (``bigrun.py``): band plus the incident's ranks on the
chart, the node map, the rank table a page at a time (paging, sorting, filtering, drill-down),
at desktop and phone width (where the table scrolls sideways in its box, every column in
reach beside its rank). Behaviour only: the speed figures are bench/page_100k.py's."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest

from .bigrun import BigRun, fill
from .conftest import BROWSER_MARKS, DESKTOP, PHONE, TABLE_COLUMNS_JS, Watched
from .procs import Server
from .test_browser import series

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = BROWSER_MARKS

PAGE_SIZE = 100
PAGED_RANKS = 1024  # rankpage.js: above this many ranks the table is paged
# Generous: a shared CI machine under load. How fast the page is, is bench/page_100k.py's.
READY_TIMEOUT_MS = 120_000

ROWS_JS = "() => [...document.querySelectorAll('#rank-body tr')].map((r) => Number(r.dataset.rank))"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BigRun, BigRun, float]:
    data = tmp_path_factory.mktemp("big") / "data"
    started = time.monotonic()
    big, named = fill(data, steps=2, hosts_world=PAGED_RANKS + 8)
    return data, big, named, time.monotonic() - started


@pytest.fixture(scope="module")
def server(stored: tuple[Path, BigRun, BigRun, float], artifacts: Path) -> Iterator[Server]:
    srv = Server(stored[0])
    yield srv
    srv.stop()
    shutil.copy(srv.log_path, artifacts / "page-100k-serve.log")


def open_run(w: Watched, server: Server, run: str) -> Page:
    w.page.goto(f"{server.url}/#run={quote(run, safe='')}")
    w.page.wait_for_function(
        "(run) => window.rankwatch && window.rankwatch.ready && window.rankwatch.state.run === run"
        " && document.querySelectorAll('#rank-body tr').length > 0",
        arg=run,
        timeout=READY_TIMEOUT_MS,
    )
    return w.page


def _rows(page: Page) -> list[int]:
    return page.evaluate(ROWS_JS)


def _wait_rows(page: Page, test: str) -> None:
    page.wait_for_function(f"() => {{ const rows = ({ROWS_JS})(); return {test}; }}")


def _click_tile(page: Page, name: str) -> None:
    """Click the node map's tile ``name`` where a person would: at its pixels."""
    x, y = page.evaluate(
        "(n) => { const m = window.rankwatch.nodemap; return m.centre(m.indexOf(n)); }", name
    )
    page.locator("#nodemap-canvas").click(position={"x": x, "y": y})


def test_100k_ranks_paged_table_node_map_band(
    server: Server,
    new_page: Callable[..., Watched],
    stored: tuple[Path, BigRun, BigRun, float],
    artifacts: Path,
) -> None:
    _, big, named, fill_s = stored
    w = new_page(DESKTOP)
    page = w.page
    started = time.monotonic()
    open_run(w, server, big.run)
    usable_s = time.monotonic() - started

    # The table: one page, the odd ranks first (the culprit, the crashed rank, those it reached).
    assert page.inner_text("#rank-showing") == "showing 1–100 of 100,000"
    rows = _rows(page)
    assert len(rows) == PAGE_SIZE
    assert rows[:4] == [big.culprit, big.crashed, *big.affected]
    page.wait_for_selector(f"#rank-body tr.role-culprit[data-rank='{big.culprit}']")
    assert "1 culprit · 1 crashed · 2 affected" in page.inner_text("#rank-counts")

    # The chart: median and bands, and the incident's ranks as lines, not 100,000 of them.
    loss = series(page, "loss")
    assert {"median", "min–max", "p5–p95"} <= set(loss)
    lines = sorted(n for n in loss if n.startswith("rank "))
    assert lines == sorted(f"rank {r}" for r in (big.culprit, *big.affected))
    assert loss[f"rank {big.culprit}"]["endLabel"]

    # The node map: 12,500 tiles of 8 ranks (no hosts), the culprit's named first.
    cells = page.evaluate("() => window.rankwatch.nodemap.cells.cells")
    assert cells == big.world // 8
    block = f"ranks {big.culprit // 8 * 8}–{big.culprit // 8 * 8 + 7}"
    assert page.inner_text("#nodemap-readout").startswith(f"worst node: {block} ·")
    assert f"worst: rank {big.culprit} culprit" in page.inner_text("#nodemap-readout")
    # the tiles' z is the table's "z now (loss)", named where it is read (the card quotes the z
    # of the step an alert was first reported at)
    assert " · max |z| now (loss) " in page.inner_text("#nodemap-readout")
    assert page.inner_text("#nodemap-legend").endswith("max |z| now (loss) in the line below")
    title = page.get_attribute("#nodemap-canvas", "title") or ""
    assert "max |z| now (loss): its rank furthest from the others on loss now" in title
    assert "z now (loss)" in page.inner_text("#rank-head")
    # a stored run whose incident was open when it ended: no FIRING, no command on the card
    card = page.inner_text("#incident")
    assert "open when the run ended" in card and "FIRING" not in card, card
    assert page.locator("#incident .inc-cmd, #actions button[data-cmd]:visible").count() == 0
    assert page.is_hidden("#rank-scroll-hint")  # the table fits: nothing to swipe for
    page.screenshot(path=artifacts / "page-100k-desktop.png", full_page=True)

    # Paging, then sorting by a header (twice: the other way round).
    page.click("#rank-next")
    page.wait_for_function(
        "() => document.getElementById('rank-showing').textContent.startsWith('showing 101–200')"
    )
    assert len(_rows(page)) == PAGE_SIZE
    page.click("#rank-head th[data-sort='rank']")
    _wait_rows(page, "rows[0] === 0 && rows[99] === 99")
    page.click("#rank-head th[data-sort='rank']")
    _wait_rows(page, f"rows[0] === {big.world - 1}")
    assert page.inner_text("#rank-showing") == "showing 1–100 of 100,000"

    # The filter box: a state.
    page.fill("#rank-filter", "crashed")
    _wait_rows(page, f"rows.length === 1 && rows[0] === {big.crashed}")
    assert page.inner_text("#rank-showing") == "showing 1–1 of 1 (of 100,000 ranks)"
    page.fill("#rank-filter", "")
    _wait_rows(page, "rows.length === 100")

    # Drill-down: the culprit's tile lists its block's ranks, and the chart draws them.
    _click_tile(page, block)
    first = big.culprit // 8 * 8
    ranks = list(range(first, first + 8))
    _wait_rows(page, f"rows.length === 8 && Math.min(...rows) === {first}")
    assert sorted(_rows(page)) == ranks
    assert page.inner_text("#rank-node") == f"ranks {first}-{first + 7} ×"
    page.wait_for_function(
        "(n) => window.rankwatch.charts.get('loss').chart.getOption().series"
        ".filter((s) => s.name.startsWith('rank ')).length === n",
        arg=len(ranks),
    )
    assert sorted(page.evaluate("() => [...window.rankwatch.state.selected]")) == ranks
    page.screenshot(path=artifacts / "page-100k-drilled.png", full_page=True)
    page.click("#rank-node")  # back to every rank
    _wait_rows(page, "rows.length === 100")
    assert page.evaluate("() => window.rankwatch.state.selected.size") == 0
    # A rank typed into the selection is taken though the table holds another page.
    page.fill("#select-input", str(big.world - 2))
    page.press("#select-input", "Enter")
    page.wait_for_function(
        "(n) => window.rankwatch.charts.get('loss').chart.getOption().series"
        ".some((s) => s.name === 'rank ' + n)",
        arg=big.world - 2,
    )
    assert page.is_hidden("#select-error")

    # A run on named nodes: a tile per host, and a host's ranks on the click.
    open_run(w, server, named.run)
    page.wait_for_function("() => window.rankwatch.nodemap.cells?.by === 'host'")
    assert page.evaluate("() => window.rankwatch.nodemap.cells.cells") == named.world // 8
    host = named.host(named.culprit)
    _click_tile(page, host)
    _wait_rows(page, "rows.length === 8")
    assert sorted(_rows(page)) == [r for r in range(named.world) if named.host(r) == host]
    assert page.inner_text("#rank-node") == f"{host} ×"

    # Phone: the same page at phone width (no reload): readable, nothing wider than the screen.
    open_run(w, server, big.run)
    page.set_viewport_size(PHONE)
    page.wait_for_function(
        f"() => document.getElementById('nodemap-canvas').clientWidth < {PHONE['width']}"
    )
    width = page.evaluate("() => document.documentElement.scrollWidth")
    page.screenshot(path=artifacts / "page-100k-phone.png", full_page=True)
    assert width <= PHONE["width"], f"the page is {width} px wide on a {PHONE['width']} px phone"
    # The table is wider than the phone: it scrolls inside its own box, says so, and every
    # column's content can be brought into view beside the rank it belongs to.
    page.wait_for_selector("#rank-scroll-hint", state="visible")
    columns = page.evaluate(TABLE_COLUMNS_JS)
    assert [c["head"] for c in columns] == [
        "rank", "host", "state", "z now (loss)", "last loss", "last step", "last seen"
    ]  # fmt: skip
    hidden = [c["head"] for c in columns if not (c["shown"] and c["rankShown"])]
    assert hidden == [], f"columns out of reach on a phone: {hidden}"
    assert all(c["rank"].startswith(str(big.culprit)) for c in columns)
    assert columns[-1]["cell"].endswith(" ago") and columns[5]["cell"] == str(big.steps)
    # a sideways swipe (the wheel's) scrolls the table, not the page
    page.locator("#rank-wrap").hover()
    page.mouse.wheel(PHONE["width"], 0)
    page.wait_for_function("() => document.getElementById('rank-wrap').scrollLeft > 0")
    assert page.evaluate("() => [scrollX, document.documentElement.scrollWidth]") == [
        0, width
    ]  # fmt: skip
    page.screenshot(path=artifacts / "page-100k-phone-table.png", full_page=True)
    assert w.errors == [], f"errors on the page: {w.errors}"
    page.context.close()
    timing = {"fill_s": round(fill_s, 2), "usable_s": round(usable_s, 2)}
    (artifacts / "page-100k.json").write_text(json.dumps(timing))
