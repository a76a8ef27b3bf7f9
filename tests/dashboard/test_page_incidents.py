"""The incident card, its colours and the phone layout in real headless Chromium.

Real agents log to a real `rankwatch serve` (real store, real incident tracker); the page is
read as a person reads it: where the card and the first chart sit in the first screen, which
row is red, whether anything is wider than the screen. Screenshots go to test-artifacts/ (or
$RANKWATCH_ARTIFACTS): incident-desktop.png, incident-phone.png and the others named below.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
from rankwatch.aggregator.incidents.model import Evidence, Incident
from rankwatch.aggregator.incidents.words import dashboard_link

from .conftest import BROWSER_MARKS, DESKTOP, PHONE, TABLE_COLUMNS_JS, Watched, resize
from .procs import Rank, Server
from .test_browser import READY_TIMEOUT_MS, SERIES_JS

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = BROWSER_MARKS


def as_incident(body: dict[str, Any]) -> Incident:
    """An incident of the API as the tracker's value (the stored ``hosts`` is not a field)."""
    keep = {k: v for k, v in body.items() if k in Incident.__dataclass_fields__}
    for key in ("culprits", "affected", "terminated"):
        keep[key] = tuple(keep[key])
    keep["timeline"] = tuple(Evidence(**e) for e in keep["timeline"])
    return Incident(**keep)


CHART_SHOWN_PX = 120  # this much of the first chart's plot must be on the first screen
RED = "rgb(220, 38, 38)"  # --bad in style.css
FAULT_STEP = 20
STEPS = 40

# Where things are on the first screen, and what overflows it sideways.
LAYOUT_JS = """() => {
  const box = (sel) => { const n = document.querySelector(sel);
    if (!n) return null; const r = n.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, shown: r.height > 0}; };
  const wide = [...document.querySelectorAll('body *')].filter((n) => {
    const r = n.getBoundingClientRect();
    return r.width > 0 && r.right > innerWidth + 1 && !n.closest('.table-wrap');
  }).map((n) => n.tagName + (n.id ? '#' + n.id : '') + '.' + n.className).slice(0, 5);
  return {scrollWidth: document.scrollingElement.scrollWidth, innerWidth, innerHeight,
    card: box('#incident'), culprit: box('#incident .inc-culprit'),
    chart: box('.chart-card .chart'), controls: box('#controls'), wide};
}"""

# Per rank: the table row's classes and text colour, shown or not; the legend chip's classes.
ROWS_JS = """() => Object.fromEntries(
  [...document.querySelectorAll('#rank-body tr[data-rank]')].map((tr) => [tr.dataset.rank, {
    cls: tr.className, color: getComputedStyle(tr.cells[0]).color,
    shown: tr.getBoundingClientRect().height > 0,
    tag: (tr.querySelector('.role-tag') || {}).textContent || null,
    chip: (document.querySelector(`#legend [data-rank="${tr.dataset.rank}"]`) || {}).className,
  }]))"""


class Serving:
    """`rankwatch serve` over one data folder, restartable (the store outlives the server)."""

    def __init__(self, data: Path, artifacts: Path) -> None:
        self.data = data
        self.artifacts = artifacts
        self.starts = 0
        self.server = self._start()

    def _start(self) -> Server:
        self.starts += 1
        return Server(self.data)

    def restart(self) -> Server:
        self.stop()
        self.server = self._start()
        return self.server

    def stop(self) -> None:
        self.server.stop()
        shutil.copy(self.server.log_path, self.artifacts / f"incidents-serve-{self.starts}.log")


@pytest.fixture
def serving(tmp_path: Path, artifacts: Path) -> Iterator[Serving]:
    s = Serving(tmp_path / "data", artifacts)
    yield s
    s.stop()


def open_run(w: Watched, server: Server, run: str, card: bool = True) -> Page:
    w.page.goto(f"{server.url}/#run={quote(run, safe='')}")
    try:
        w.page.wait_for_function(
            "() => window.rankwatch && window.rankwatch.ready", timeout=READY_TIMEOUT_MS
        )
        if card:
            wait_for_card(w.page)
    except Exception:
        shown = w.page.evaluate("() => document.getElementById('error').textContent")
        raise AssertionError(f"no incident card; the page says: {shown!r}") from None
    return w.page


def wait_for_card(page: Page) -> None:
    page.wait_for_function(
        "() => !document.getElementById('incident').hidden", timeout=READY_TIMEOUT_MS
    )


def incidents(server: Server, run: str) -> list[dict[str, Any]]:
    return server.get("/api/run/incidents", run=run)["incidents"]


def culprit_named(server: Server, run: str, culprit: int) -> list[dict[str, Any]]:
    return [i for i in incidents(server, run) if i["culprits"] == [culprit]]


def nan_spread(ranks: list[Rank], steps: range) -> None:
    """Rank 2 non-finite at step 20; every rank non-finite from 21, as an all-reduce spreads it."""
    for step in steps:
        for rank, agent in enumerate(ranks):
            loss = 2.0 / step + 0.3 + 0.01 * rank
            if step > FAULT_STEP or (rank == 2 and step == FAULT_STEP):
                loss = math.nan
            agent.log(step, loss=loss, step_time=0.5 + 0.01 * rank)


def check_layout(page: Page, where: str) -> dict[str, Any]:
    got = page.evaluate(LAYOUT_JS)
    assert got["scrollWidth"] <= got["innerWidth"], f"{where}: wider than the screen: {got}"
    assert not got["wide"], f"{where}: these stick out on the right: {got['wide']}"
    card, culprit, chart = got["card"], got["culprit"], got["chart"]
    assert card["top"] < 200, f"{where}: the incident card is not at the top: {card}"
    assert culprit["bottom"] <= got["innerHeight"], f"{where}: the culprit is below the fold"
    assert chart["top"] + CHART_SHOWN_PX <= got["innerHeight"], (
        f"{where}: the first chart starts at {chart['top']:.0f} px of {got['innerHeight']}"
    )
    return got


def check_colours(
    page: Page, culprit: int, affected: list[int], where: str, table: bool = True
) -> None:
    if table:
        rows = page.evaluate(ROWS_JS)
        row = rows[str(culprit)]
        assert "role-culprit" in row["cls"] and row["color"] == RED, f"{where}: {row}"
        assert row["tag"] == "culprit"
        assert "role-culprit" in row["chip"]
        for rank in affected:
            other = rows[str(rank)]
            assert "role-affected" in other["cls"], f"{where}: rank {rank}: {other}"
            assert other["tag"] == "affected"
            assert other["color"] != RED, f"{where}: affected rank {rank} is red too"
            assert "role-affected" in other["chip"]
    loss = {s["name"]: s for s in page.evaluate(SERIES_JS, "loss")}
    bad = loss[f"rank {culprit}"]
    for rank in affected:
        line = loss[f"rank {rank}"]
        assert bad["width"] > line["width"], f"{where}: the culprit's line is not the boldest"
        assert line["color"] != bad["color"]
        assert not line["endLabel"] and not line["markers"], f"{where}: rank {rank} labelled"
    assert bad["endLabel"] and [m[1] for m in bad["markers"]] == [FAULT_STEP]
    dashed = page.evaluate(
        "(r) => window.rankwatch.charts.get('loss').chart.getOption().series"
        ".find((s) => s.name === 'rank ' + r).lineStyle.type",
        affected[0],
    )
    assert dashed == "dashed"


def card_text(page: Page) -> str:
    return page.inner_text("#incident")


# A run that is over: the card and history in words, the picker, the command buttons shown.
OVER_JS = """() => ({card: document.getElementById('incident').innerText,
  picker: document.getElementById('run').selectedOptions[0].textContent,
  history: document.getElementById('incident-history').innerText,
  buttons: [...document.querySelectorAll('#incident .inc-cmd, #actions button[data-cmd]')]
    .filter((b) => b.offsetParent !== null).map((b) => b.textContent)})"""


def check_over(page: Page, server: Server, run: str, where: str) -> None:
    """An incident still open when its run ended says so (not FIRING), no button offers a
    command the server would refuse, and the run picker has the run's state now."""
    (state,) = [r["state"] for r in server.get("/api/runs")["runs"] if r["run"] == run]
    label = f"{run} ({state},"

    def shows(*words: str) -> None:
        try:
            page.wait_for_function(
                f"([ws, l]) => {{ const g = ({OVER_JS})();"
                " return ws.some((w) => g.card.includes(w))"
                " && !g.buttons.length && g.picker.startsWith(l); }",
                arg=[words, label], timeout=10_000,
            )  # fmt: skip
        except Exception:
            raise AssertionError(f"{where}: {words} {page.evaluate(OVER_JS)}") from None

    # Its alerts may still resolve it after the run ended, at any moment (resolved is final).
    shows("open when the run ended", "resolved")
    (inc,) = incidents(server, run)
    if inc["state"] != "firing":
        shows("resolved")
    got = page.evaluate(OVER_JS)
    assert "FIRING" not in got["card"] and "firing" not in got["history"], (where, got)


def test_nan_spread_names_the_culprit_on_desktop_and_phone(
    serving: Serving, new_page: Callable[..., Watched], artifacts: Path, tmp_path: Path
) -> None:
    run = "msrun4-nan"
    server = serving.server
    ranks = [Rank(server, run, rank, 4, tmp_path) for rank in range(4)]
    try:
        nan_spread(ranks, range(1, FAULT_STEP - 5))
        server.wait_for("every rank at step 14", lambda: [
            r["last_step"] for r in server.get("/api/run/ranks", run=run)["ranks"]
        ] == [FAULT_STEP - 6] * 4)  # fmt: skip
        assert incidents(server, run) == []
        desk = new_page(DESKTOP)
        page = open_run(desk, server, run, card=False)
        assert page.locator("#incident").is_hidden()  # a healthy run shows no card
        page.evaluate("() => { window.__sameDocument = true; }")
        nan_spread(ranks, range(FAULT_STEP - 5, STEPS + 1))
        inc = server.wait_for("an incident naming rank 2", lambda: culprit_named(server, run, 2))
        assert inc[0]["cause"] == "nonfinite" and sorted(inc[0]["affected"]) == [0, 1, 3]
        ranks_now = {r["rank"]: r for r in server.get("/api/run/ranks", run=run)["ranks"]}
        wait_for_card(page)  # live, from the stream: no reload
        page.wait_for_function(
            "() => document.getElementById('incident').innerText.includes('3 ranks affected')"
        )
        assert page.evaluate("() => window.__sameDocument") is True
        text = card_text(page)
        assert "rank 2" in text and f"pid {ranks_now[2]['pid']}" in text
        assert str(ranks_now[2]["host"]) in text
        assert "3 ranks affected after it: 0, 1, 3" in text
        assert "FIRING" in text and f"step {FAULT_STEP}" in text
        assert "3 ranks" in page.inner_text("#incident .inc-tl")  # the ranks that followed: one row
        assert "(ranks 0-1, 3)" in text and "pieces of evidence kept" not in text  # all 4 shown
        # the timeline starts with the culprit's evidence, drawn red
        first = page.locator("#incident .inc-tl tr").first
        assert "rank 2" in first.inner_text() and "inc-tl-culprit" in (
            first.get_attribute("class") or ""
        )
        page.wait_for_function(  # the charts restyle once the incident has arrived
            "() => window.rankwatch.charts.get('loss').chart.getOption().series"
            ".find((s) => s.name === 'rank 2').lineStyle.width > 3"
        )
        check_layout(page, "desktop")
        check_colours(page, 2, [0, 1, 3], "desktop")
        # one alert per rank and metric folds behind one button while the card names the culprit
        page.locator("#alerts-toggle").wait_for(state="visible")
        assert page.locator("#banner").is_hidden()
        assert "alerts firing: show them" in page.inner_text("#alerts-toggle")
        page.screenshot(path=artifacts / "incident-desktop.png")
        page.click("#alerts-toggle")
        assert page.locator("#banner").is_visible()
        page.click("#incident-history summary")
        items = page.locator("#incident-history li").all_inner_texts()
        assert len(items) == 1 and "rank 2" in items[0] and "FIRING" in items[0]

        phone = new_page(PHONE)
        page = open_run(phone, server, run)
        page.wait_for_function(
            "() => window.rankwatch.charts.get('loss').chart.getOption().series"
            ".find((s) => s.name === 'rank 2').lineStyle.width > 3"
        )
        got = check_layout(page, "phone")
        assert not got["controls"]["shown"], "controls take the first screen on a phone"
        check_colours(page, 2, [0, 1, 3], "phone")
        page.screenshot(path=artifacts / "incident-phone.png")
        page.screenshot(path=artifacts / "incident-phone-full.png", full_page=True)
        page.click("#controls-toggle")
        assert page.evaluate(LAYOUT_JS)["controls"]["shown"]
        for w in (desk, phone):
            assert w.errors == [], f"errors on the page: {w.errors}"
    finally:
        for agent in ranks:
            agent.close()

    # The run ends: the card stays, on a reload and after `serve` restarts over the store.
    server.wait_for(
        "the run to end",
        lambda: (
            next(r for r in server.get("/api/runs")["runs"] if r["run"] == run)["state"]
            in ("finished", "history")
        ),
    )
    page = open_run(desk, server, run)
    assert "rank 2" in card_text(page)
    check_over(page, server, run, "after the run ended")
    check_colours(page, 2, [0, 1, 3], "after the run ended")
    page.screenshot(path=artifacts / "incident-after-end.png")
    resize(page, PHONE)
    check_layout(page, "phone, after the run ended")
    page.screenshot(path=artifacts / "incident-after-end-phone.png")
    page.set_viewport_size(DESKTOP)
    phone.page.context.close()
    server = serving.restart()
    page = open_run(desk, server, run)
    assert "rank 2" in card_text(page) and "3 ranks affected" in card_text(page)
    check_over(page, server, run, "after serve restarted")  # a history run
    where = f"{ranks_now[2]['host']} · pid {ranks_now[2]['pid']}"
    assert where in card_text(page)
    # A server restarted while the job runs on has no entry for a rank that crashed before it
    # started: the card then says where the culprit ran from the stored incident.
    without_entries = page.evaluate("""async () => {
      const m = await import('/static/incidents.js');
      const node = document.createElement('div');
      m.renderIncidentCard(node, [], Date.now() / 1000);
      return node.querySelector('.inc-culprit').innerText; }""")
    assert where in without_entries
    # the link incident messages carry (serve --public-url): that run, the culprit, the step
    link = dashboard_link(server.url, as_incident(incidents(server, run)[0]))
    page.goto("about:blank")
    page.goto(link)
    page.wait_for_function("() => window.rankwatch && window.rankwatch.ready")
    got = page.evaluate("() => { const s = window.rankwatch.state;"
                        " return [s.run, [...s.selected], s.zoom]; }")  # fmt: skip
    assert got == [run, [2], {"start": 0, "end": FAULT_STEP + 20}]
    # A restarted server lists no rank entries for a stored run (its rank table is empty), so
    # only the charts carry the roles here.
    check_colours(page, 2, [0, 1, 3], "after serve restarted", table=False)
    page.screenshot(path=artifacts / "incident-after-restart.png")
    assert desk.errors == [], f"errors on the page: {desk.errors}"
    desk.page.context.close()


def test_phone_table_shows_the_ranks_that_matter_and_markup_stays_text(
    serving: Serving, new_page: Callable[..., Watched], artifacts: Path, tmp_path: Path
) -> None:
    run, world, bad = "eight-ranks", 8, 5
    metric = "<img src=x onerror=alert(1)>"
    server = serving.server
    ranks = [Rank(server, run, rank, world, tmp_path) for rank in range(world)]
    try:
        for step in range(1, STEPS + 1):
            for rank, agent in enumerate(ranks):
                value = 2.0 / step + 0.3 + 0.002 * rank
                if rank == bad and step >= FAULT_STEP:
                    value = math.nan
                # step_time given, not measured: the harness logs the ranks one after another
                agent.log(step, loss=2.0 / step + 0.3, step_time=0.5, **{metric: value})
        server.wait_for("an incident naming rank 5", lambda: culprit_named(server, run, bad))
        phone = new_page(PHONE)
        page = open_run(phone, server, run)
        check_layout(page, "phone, 8 ranks")
        rows = page.evaluate(ROWS_JS)
        shown = sorted(int(r) for r, row in rows.items() if row["shown"])
        assert shown == [bad], f"the phone table shows {shown}"
        assert rows[str(bad)]["color"] == RED
        # Every column is in reach beside the rank (the box scrolls sideways): a straggler's
        # throughput and a silent rank's last seen are what its incident is about.
        page.wait_for_selector("#rank-scroll-hint", state="visible")
        columns = page.evaluate(TABLE_COLUMNS_JS)
        heads = [c["head"] for c in columns]
        assert {"peak z (loss)", "throughput", "last seen"} <= set(heads), heads
        hidden = [c["head"] for c in columns if not (c["shown"] and c["rankShown"])]
        assert hidden == [], f"columns out of reach on a phone: {hidden}"
        assert all(c["rank"].startswith(str(bad)) for c in columns), columns
        assert columns[-1]["cell"].endswith(" ago"), columns[-1]
        wrap = page.locator("#rank-wrap")
        wrap.evaluate("(w) => { w.scrollLeft = w.scrollWidth; }")
        wrap.screenshot(path=artifacts / "incident-phone-8-ranks-table-scrolled.png")
        wrap.evaluate("(w) => { w.scrollLeft = 0; }")
        toggle = page.locator("#all-ranks")
        assert toggle.inner_text() == f"show all {world} ranks"
        toggle.click()
        rows = page.evaluate(ROWS_JS)
        assert all(row["shown"] for row in rows.values())
        page.screenshot(path=artifacts / "incident-phone-8-ranks.png", full_page=True)
        assert metric in card_text(page) or metric in page.inner_text("#incident-history")
        assert page.evaluate("() => document.querySelectorAll('img').length") == 0
        assert phone.dialogs == [] and phone.errors == []
        phone.page.context.close()
    finally:
        for agent in ranks:
            agent.close()


ROLES_JS = """async () => {
  const m = await import('/static/incidents.js');
  const inc = (id, state, opened, culprits, affected, terminated = []) => ({
    id, run: 'r', cause: 'nonfinite', culprits, affected, terminated, timeline: [], opened,
    updated: opened, resolved: state === 'resolved' ? opened + 1 : null, state,
    summary: id, basis: '', step: 1, evidence_count: 0});
  const roles = () => [0, 1, 2, 3, 4, 5].map(m.rankRole);
  const out = {};
  const two = () => [
    inc('r#2', 'resolved', 20, [3], [4]), inc('r#1', 'firing', 10, [0], [3, 1], [5])];
  out.changed = m.setIncidents(two());
  out.same = m.setIncidents(two());
  const more = two();
  more[1].evidence_count = 9;
  out.moreEvidence = m.setIncidents(more);  // the card changes, no rank's role does
  out.shown = m.shown().id;  // the firing one, though older
  out.roles = roles();
  m.focusIncident('r#2');
  out.focused = [m.shown().id, ...roles()];  // rank 3: culprit of the shown one wins
  m.focusIncident(null);
  const done = inc('r#1', 'resolved', 10, [0], [3, 1], [5]);
  m.applyIncidentChange({type: 'incident', change: 'resolved', incident: done});
  out.allResolved = [m.shown().id, ...roles()];  // the newest one stays on the card
  out.selected = [m.roleStyle(4, new Set([4])), m.roleStyle(3, new Set([3])).kind];
  m.setIncidents([inc('r#3', 'firing', 30, [0, 1, 2, 3, 4], [])]);  // no single culprit
  out.everyRank = roles();
  return out;
}"""


# An incident still open when its run ended, on the card and in the history, with the run live
# and over; and which runs actions.js counts as live (the server takes commands for those only).
ENDED_JS = """async () => {
  const m = await import('/static/incidents.js');
  const a = await import('/static/actions.js');
  m.setIncidents([{id: 'r#1', run: 'r', cause: 'nonfinite', culprits: [2], affected: [0],
    terminated: [], timeline: [], opened: 10, updated: 10, resolved: null, state: 'firing',
    summary: 's', basis: '', step: 1, evidence_count: 0}]);
  const shown = (live) => {
    const card = document.createElement('div');
    const history = document.createElement('div');
    m.renderIncidentCard(card, [], 20, live);
    m.renderHistory(history, 20, live);
    return [card.className, card.querySelector('.inc-pill').textContent,
      card.querySelectorAll('.inc-cmd').length, history.textContent];
  };
  const runs = [[{state: 'history'}, null], [{state: 'finished'}, []],
    [{state: 'crashed'}, [{state: 'crashed'}, {state: 'finished'}]],
    [{state: 'crashed'}, [{state: 'crashed'}, {state: 'alive'}]],
    [{state: 'running'}, []], [{state: 'stalled'}, null], [null, null]];
  return {live: shown(true), over: shown(false), runs: runs.map(([r, t]) => a.runIsLive(r, t))};
}"""


def test_rank_roles_follow_the_shown_and_the_firing_incidents(
    serving: Serving, new_page: Callable[..., Watched]
) -> None:
    w = new_page(DESKTOP)
    w.page.goto(serving.server.url)
    out = w.page.evaluate(ROLES_JS)
    assert out["changed"] == {"roles": True} and out["same"] is None
    assert out["moreEvidence"] == {"roles": False}
    assert out["shown"] == "r#1"
    assert out["roles"] == ["culprit", "affected", None, "affected", None, "terminated"]
    assert out["focused"] == [
        "r#2",
        "culprit",
        "affected",
        None,
        "culprit",
        "affected",
        "terminated",
    ]
    assert out["allResolved"] == ["r#2", None, None, None, "culprit", "affected", None]
    assert out["selected"] == [None, "culprit"]  # a selected rank keeps blue, unless culprit
    assert out["everyRank"] == [None] * 6
    got = w.page.evaluate(ENDED_JS)
    assert got["live"][:3] == ["incident card firing", "FIRING", 2]
    assert "(1 firing)" in got["live"][3]
    assert got["over"][:3] == ["incident card ended", "open when the run ended", 0]
    assert "(1 open when the run ended)" in got["over"][3] and "FIRING" not in got["over"][3]
    assert got["runs"] == [False, False, False, True, True, True, False]
    assert w.errors == []
    w.page.context.close()
