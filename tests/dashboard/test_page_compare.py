"""A reference run laid over every chart, in real headless Chromium against a real `rankwatch
serve` fed 4-rank msrun traces (tests/fixtures) over its ingest API.

The previous run of the same job is the default reference: its median per metric is one dashed
line labelled "ref", the tooltip gives its value at the step, and a line under each chart's title
compares this run with it at the last step both have (the API's figures). A metric the reference
lacks says so. The reference stays put while this run streams; the picker lists every stored run
(newest first) and "none"; a history run takes a reference too; at 390x844 nothing is wider than
the screen. Screenshots go to test-artifacts/ (or $RANKWATCH_ARTIFACTS).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from rankwatch.agent.wire.records import StepRecord

from .conftest import FIXTURES, fixture_rows
from .procs import Server

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
from playwright.sync_api import Browser, Page

from .test_browser import (  # noqa: F401 - the fixtures, shared with the page's other tests
    READY_TIMEOUT_MS,
    open_run,
    pytestmark,
    series,
    server,
    show_tooltip,
    stored_up_to,
)
from .test_page_panels import DESKTOP, PHONE, close, page_at, post

CLEAN = FIXTURES / "msrun4_clean.csv"
REF = "train-1201-2200-aaaa"  # the previous run of job "train"
OTHER = "eval-1201-2205-cccc"  # another job: listed, never the default
RUN = "train-1201-2210-bbbb"
REF_SCALE = 1.25  # the reference's loss is this much higher: its line stands apart
LIVE_S = 20.0


def feed(srv: Server, run: str, lo: int, hi: int, t0: float, scale: float, data_time: bool) -> None:
    seq: dict[int, int] = {}
    out = []
    for step, rank, loss in fixture_rows(CLEAN):
        seq[rank] = seq.get(rank, 0) + 1
        if not lo <= step <= hi:
            continue
        wobble = 1 + 0.002 * math.sin(rank * 7.1 + step * 1.3)
        metrics = {"loss": loss * scale, "throughput": 1450.0 * wobble / scale}
        if data_time:
            metrics["data_time"] = 0.012 * wobble
        out.append(StepRecord(
            run=run, rank=rank, seq=seq[rank], time=t0 + step, world_size=4,
            host=f"node{rank // 2}", pid=100 + rank, step=step, epoch=None, metrics=metrics,
        ))  # fmt: skip
    post(srv, out)


def fmt5(v: float) -> str:
    """util.js fmt: 5 significant digits."""
    return f"{float(f'{v:.5g}'):g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"


def compare(srv: Server, run: str, **params: str) -> dict[str, Any]:
    res = srv.get(f"/api/runs/{quote(run, safe='')}/compare", **params)
    return {m["metric"]: m for m in res["metrics"]} | {"": res}


def ref_line(page: Page, metric: str) -> dict[str, Any] | None:
    return series(page, metric).get(f"ref: {REF}")


def ref_text(page: Page, metric: str) -> str:
    return page.evaluate(
        "(m) => { const c = window.rankwatch.charts.get(m);"
        " return c.refEl.hidden ? '' : c.refEl.textContent; }",
        metric,
    )


def wait_ref(page: Page, run: str | None) -> None:
    """Until the page uses reference ``run`` and every chart has drawn it (None: until no chart
    draws one). A choice takes effect on the charts at their next redraw (at most 4 a second),
    not when it is made: a check right after picking "none" would see the old line."""
    page.wait_for_function(
        "(r) => { const ref = window.rankwatch.ref; if (ref.run !== r) return false;"
        " if (r === null) return (ref.autoChecked || window.rankwatch.state.refNone)"
        " && [...window.rankwatch.charts.values()].every((c) => c.refEl.hidden"
        " && !c.chart.getOption().series.some((s) => s.id === 'ref'));"
        " return [...window.rankwatch.charts.values()].every((c) => c.ref && c.ref.run === r"
        " && (c.ref.missing || (c.ref.line && !c.refEl.textContent.endsWith(r)"
        " && c.chart.getOption().series.some((s) => s.id === 'ref')))); }",
        arg=run,
        timeout=READY_TIMEOUT_MS,
    )


def no_overflow(page: Page) -> None:
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width} px wide at {PHONE['width']}"
    for metric in ("loss", "data_time"):
        box = page.evaluate(
            "(m) => window.rankwatch.charts.get(m).refEl.getBoundingClientRect().right", metric
        )
        assert box <= PHONE["width"], (metric, box)


def test_reference_run_overlay(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
) -> None:
    now = time.time()
    feed(server, REF, 1, 60, now - 600, REF_SCALE, data_time=False)
    feed(server, OTHER, 1, 10, now - 400, 1.0, data_time=True)
    feed(server, RUN, 1, 20, now - 120, 1.0, data_time=True)
    for run, last in ((REF, 60), (OTHER, 10), (RUN, 20)):
        server.wait_for(f"{run} stored", lambda r=run, s=last: stored_up_to(server, r, 4, s))

    w = page_at(browser, DESKTOP)
    page = open_run(w, server, RUN)
    wait_ref(page, REF)
    picker = page.evaluate(
        "() => [...document.getElementById('ref').options].map((o) => [o.value, o.text])"
    )
    assert picker[:2] == [["auto", f"previous run of this job: {REF}"], ["none", "none"]]
    assert [v for v, _ in picker[2:]] == [f"={OTHER}", f"={REF}"]  # newest first, not itself
    assert page.input_value("#ref") == "auto"

    # The reference's median, dashed and labelled, over this run's steps only.
    line = ref_line(page, "loss")
    assert line is not None and line["endLabel"]
    style = page.evaluate(
        "() => window.rankwatch.charts.get('loss').chart.getOption().series"
        ".find((s) => s.id === 'ref').lineStyle"
    )
    assert style["type"] != "solid" and style["color"] != "#9aa5b1"
    assert line["steps"] == list(range(1, 22))  # to one step past this run's last
    api = compare(server, RUN)
    assert api[""]["ref"] == REF and api["loss"]["last"]["step"] == 20
    pct = (api["loss"]["last"]["ratio"] - 1) * 100
    text = ref_text(page, "loss")
    this, ref = (fmt5(api["loss"]["last"][k]) for k in ("run", "ref"))
    assert text == f"ref: {REF} · step 20: this run {this} ({pct:+.1f}%), ref {ref}", text
    assert pct == pytest.approx(100 / REF_SCALE - 100, abs=0.5)
    # A metric the reference never logged: said, not silently left out.
    assert ref_line(page, "data_time") is None
    assert ref_text(page, "data_time") == f"ref: {REF} has no data_time data, nothing to overlay"
    show_tooltip(page, "loss", 12, 1.0)
    tip = page.inner_text(".tt-ref")
    ref_median = api["loss"]  # the tooltip's value is the reference's median at step 12
    assert tip.startswith("ref at step 12: "), tip
    assert ref_median["common_steps"] == 20
    page.screenshot(path=artifacts / "compare-overlay-desktop.png", full_page=True)

    # Live: this run streams on, the comparison follows, the reference's line is not re-read.
    page.evaluate("() => { window.rankwatch.ref.lines.get('loss').mark = 1; }")
    feed(server, RUN, 21, 40, now - 120, 1.0, data_time=True)
    page.wait_for_function(
        "() => window.rankwatch.charts.get('loss').refEl.textContent.includes('· step 40:')",
        timeout=LIVE_S * 1000,
    )
    assert page.evaluate("() => window.rankwatch.ref.lines.get('loss').mark") == 1
    page.wait_for_function(
        "() => window.rankwatch.charts.get('loss').chart.getOption().series"
        ".find((s) => s.id === 'ref').data.length === 41"
    )
    show_tooltip(page, "loss", 35, 1.0)
    page.screenshot(path=artifacts / "compare-overlay-live-desktop.png", full_page=True)

    # None, then a run named in the picker: the overlay follows, and the link keeps it.
    page.select_option("#ref", "none")
    wait_ref(page, None)
    assert ref_line(page, "loss") is None and ref_text(page, "loss") == ""
    assert "noref=1" in page.url
    page.select_option("#ref", f"={OTHER}")
    page.wait_for_function(
        "(r) => window.rankwatch.ref.run === r"
        " && window.rankwatch.charts.get('loss').refEl.textContent.includes('step 10')",
        arg=OTHER,
    )
    assert f"ref={quote(OTHER)}" in page.url
    close(w)

    # A stored run seen later: no earlier run of its job, says so; a named reference works.
    # That is an answer, not an error: no 404 for the browser to log on every such page.
    alone = compare(server, REF)[""]
    assert alone["ref"] is None and alone["metrics"] == [] and alone["only_in_ref"] == []
    assert alone["ref_reason"] == "no earlier run of the same job"
    assert "loss" in alone["only_in_run"]
    unknown = httpx.get(
        f"{server.url}/api/runs/{quote(REF, safe='')}/compare", params={"ref": "nope"}
    )
    assert unknown.status_code == 404 and "nope" in unknown.text
    w = page_at(browser, DESKTOP)
    refused: list[str] = []
    w.page.on(
        "response", lambda r: refused.append(f"{r.status} {r.url}") if r.status >= 400 else None
    )
    page = open_run(w, server, REF)
    wait_ref(page, None)
    assert (
        page.evaluate("() => document.getElementById('ref').selectedOptions[0].text")
        == "previous run of this job: none stored"
    )
    assert ref_text(page, "loss") == ""
    assert refused == [], f"the page's reads refused: {refused}"
    page = open_run(w, server, REF, f"&ref={quote(RUN)}")
    wait_ref(page, RUN)
    assert ref_text(page, "loss").startswith(f"ref: {RUN} · step 40: ")
    assert series(page, "loss")[f"ref: {RUN}"]["steps"][-1] == 40
    # Band view: this run's median is solid, the reference's dashed.
    page = open_run(w, server, RUN, "&view=band")
    wait_ref(page, REF)
    show_tooltip(page, "loss", 30, 0.5)
    assert page.inner_text(".tt-ref").startswith("ref at step 30: ")
    page.screenshot(path=artifacts / "compare-overlay-band-desktop.png")
    close(w)

    feed(server, RUN, 41, 50, now - 120, 1.0, data_time=True)  # live again
    server.wait_for("step 50 stored", lambda: stored_up_to(server, RUN, 4, 50))
    # A phone: one column, the overlay and its line readable, nothing wider than the screen.
    w = page_at(browser, PHONE)
    page = open_run(w, server, RUN)
    wait_ref(page, REF)
    no_overflow(page)
    assert ref_line(page, "loss") is not None
    page.screenshot(path=artifacts / "compare-overlay-phone.png", full_page=True)
    page.screenshot(path=artifacts / "compare-overlay-phone-first-screen.png")
    page.click("#controls-toggle")
    assert page.is_visible("#ref")
    no_overflow(page)
    page.screenshot(path=artifacts / "compare-picker-phone.png")
    show_tooltip(page, "loss", 30, 1.0)
    page.locator(".chart-card").first.screenshot(
        path=artifacts / "compare-overlay-phone-tooltip.png"
    )
    close(w)
