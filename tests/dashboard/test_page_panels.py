"""Every panel tells the same story: the page in real headless Chromium, against a real
`rankwatch serve` fed the two 4-rank msrun traces (tests/fixtures) over its ingest API.

The heatmap is fault red only where the detector flagged; the charts, the table and the heatmap
say which step they show and follow the live stream to the same one; every z says which z it
is; a NaN storm is one marker; units, zero-based axes, constant series, a few-rank band and a
bad rank selection read as a person expects. Screenshots at desktop size and 390x844 go to
test-artifacts/ (or $RANKWATCH_ARTIFACTS).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
from rankwatch.agent.wire.records import StepRecord, to_wire
from rankwatch.dashboard.jsonenc import dumps

from .conftest import FIXTURES, fixture_rows
from .procs import Server

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
from playwright.sync_api import Browser, Page

from .test_browser import (  # noqa: F401 - the fixtures, shared with the page's other tests
    READY_TIMEOUT_MS,
    Watched,
    firing,
    open_run,
    pytestmark,
    series,
    server,
    show_tooltip,
    stored_up_to,
)

CLEAN = FIXTURES / "msrun4_clean.csv"
SHIFTED = FIXTURES / "msrun4_rank2_labels_shifted_from_step20.csv"
DESKTOP = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}
LR = 3e-4
FLAGGED_CELL = 50  # heatmap.js: where a flagged cell sits on the colour scale
LIVE_S = 15.0  # the panels reach the stream's step this soon


class Feed:
    """Step records of one run from a 4-rank trace, posted to the server's ingest API."""

    def __init__(self, srv: Server, run: str, path: Path) -> None:
        self.server = srv
        self.run = run
        self.rows = fixture_rows(path)
        self.seq: dict[int, int] = {}
        self.t0 = time.time() - 120  # recent: the aggregator treats the run as live

    def record(self, rank: int, step: int, **metrics: float) -> StepRecord:
        self.seq[rank] = self.seq.get(rank, 0) + 1
        return StepRecord(
            run=self.run, rank=rank, seq=self.seq[rank], time=self.t0 + step, world_size=4,
            host=f"node{rank // 2}", pid=100 + rank, step=step, epoch=None, metrics=metrics,
        )  # fmt: skip

    def steps(self, lo: int, hi: int, lr: float = LR) -> None:
        out = []
        for step, rank, loss in self.rows:
            if lo <= step <= hi:
                wobble = 1 + 0.002 * math.sin(rank * 7.1 + step * 1.3)
                out.append(self.record(
                    rank, step, loss=loss, lr=lr, throughput=1450.0 * wobble,
                    step_time=0.35 * wobble, data_time=0.012 * wobble,
                ))  # fmt: skip
        post(self.server, out)


def post(srv: Server, records: list[StepRecord]) -> None:
    body = {"records": [to_wire(r) for r in records]}  # NaN as "NaN", as in the JSONL
    res = httpx.post(
        f"{srv.url}/api/ingest",
        content=dumps(body),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert res.status_code == 200 and res.json()["rejected"] == 0, res.text


def page_at(chromium: Browser, size: dict[str, int]) -> Watched:
    w = Watched(chromium.new_context(viewport=size).new_page())
    # A request cut short by leaving the page (ERR_ABORTED: the stream, on goto) is no fault.
    w.page.on(
        "requestfailed",
        lambda r: "ERR_ABORTED" in str(r.failure) or w.errors.append(f"{r.url}: {r.failure}"),
    )
    return w


def close(w: Watched) -> None:
    shown = w.page.evaluate("() => document.getElementById('error').textContent")
    w.page.context.close()
    assert w.errors == [], f"errors on the page: {w.errors}"
    assert not shown, f"the page says: {shown}"


def fault_cells(page: Page) -> list[tuple[int, int]]:
    """(step, rank) of every heatmap cell drawn in the fault colour."""
    return [
        tuple(c)
        for c in page.evaluate(
            "(f) => { const h = window.rankwatch.heatmap;"
            " return h.chart.getOption().series[0].data.filter((d) => d[2] === f)"
            ".map((d) => [h.steps[d[0]], h.ranks[d[1]]]); }",
            FLAGGED_CELL,
        )
    ]


def heat_ready(page: Page, step: int) -> None:
    page.wait_for_function(
        "(s) => window.rankwatch.heatmap.lastStep === s", arg=step, timeout=READY_TIMEOUT_MS
    )


def shoot(page: Page, artifacts: Path, name: str) -> None:
    page.screenshot(path=artifacts / f"{name}.png", full_page=True)


def test_heatmap_is_red_only_where_the_detector_flagged(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
) -> None:
    Feed(server, "msrun4-clean", CLEAN).steps(1, 60)
    Feed(server, "msrun4-shifted", SHIFTED).steps(1, 60)
    server.wait_for("rank 2 flagged", lambda: firing(server, "msrun4-shifted"))
    for run in ("msrun4-clean", "msrun4-shifted"):
        server.wait_for(f"{run} stored", lambda run=run: stored_up_to(server, run, 4, 60))
    for size, tag in ((DESKTOP, "desktop"), (PHONE, "phone")):
        w = page_at(browser, size)
        page = open_run(w, server, "msrun4-clean")
        heat_ready(page, 60)
        far = page.evaluate(
            "() => window.rankwatch.heatmap.chart.getOption().series[0].data"
            ".filter((d) => Math.abs(d[3]) >= 4).length"
        )
        assert far >= 1  # the healthy trace's one-step jump (z 4.6): grey, not red
        assert fault_cells(page) == []
        shoot(page, artifacts, f"panels-heatmap-clean-{tag}")
        page = open_run(w, server, "msrun4-shifted")
        heat_ready(page, 60)
        cells = fault_cells(page)
        assert {r for _, r in cells} == {2}
        assert sorted(s for s, _ in cells) == list(range(20, 61))
        legend = page.evaluate(
            "() => window.rankwatch.heatmap.chart.getOption().visualMap[0].pieces"
            ".map((p) => p.label)"
        )
        assert "flagged by the detector" in legend and "|z| ≥ 6, not flagged" in legend
        shoot(page, artifacts, f"panels-heatmap-shifted-{tag}")
        close(w)


def step_tags(page: Page) -> dict[str, str]:
    return page.evaluate(
        "() => ({chart: document.querySelector('.chart-card .step-tag').textContent,"
        " table: (document.getElementById('table-step') || {}).textContent,"
        " heatmap: document.getElementById('heat-step').textContent})"
    )


def test_panels_follow_the_stream_to_one_step_and_name_each_z(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
) -> None:
    run = "msrun4-live"
    feed = Feed(server, run, SHIFTED)
    feed.steps(1, 30)
    server.wait_for("rank 2 flagged", lambda: firing(server, run))
    server.wait_for("step 30 stored", lambda: stored_up_to(server, run, 4, 30))
    for size in (DESKTOP, PHONE):
        w = page_at(browser, size)
        page = open_run(w, server, run)
        page.wait_for_function(
            "() => document.getElementById('heat-step').textContent === 'at step 30'"
        )
        assert step_tags(page) == {k: "at step 30" for k in ("chart", "table", "heatmap")}
        close(w)
    w = page_at(browser, DESKTOP)
    page = open_run(w, server, run)
    lags = []
    for hi in (40, 50, 60):  # the run goes on while the page is open: no reload, no timers
        sent = time.monotonic()
        feed.steps(hi - 9, hi)
        want = f"at step {hi}"
        try:
            page.wait_for_function(
                "(s) => { const t = [...document.querySelectorAll('.step-tag')];"
                " return t.length >= 3 && t.every((e) => e.textContent === s); }",
                arg=want,
                timeout=LIVE_S * 1000,
            )
        except Exception:
            raise AssertionError(f"panels at {step_tags(page)}, stream at {want}") from None
        lags.append(time.monotonic() - sent)
    print(f"every panel at the stream's step {', '.join(f'{x:.2f}' for x in lags)} s after it")
    banner = page.inner_text("#banner")
    assert "rank 2 · loss" in banner
    assert "z at first report" in banner and "z now" in banner
    heads = page.locator("#rank-head th").all_inner_texts()
    assert "z now (loss)" in heads and "peak z (loss)" in heads
    peak = page.locator("#rank-body tr[data-rank='2'] td.zpeak").inner_text()
    assert float(peak) > 6
    show_tooltip(page, "loss", 40, 1.0)
    assert "z at step 40, against the drawn ranks" in page.inner_text(".tt-band")
    shoot(page, artifacts, "panels-live-step-60-desktop")
    close(w)
    w = page_at(browser, PHONE)
    page = open_run(w, server, run)
    heat_ready(page, 60)
    shoot(page, artifacts, "panels-live-step-60-phone")
    close(w)


def test_nan_storm_is_one_marker_and_a_count(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
) -> None:
    run, world = "nan-storm", 8
    seq: dict[int, int] = {}
    t0 = time.time() - 60
    records = []
    for step in range(1, 21):
        for rank in range(world):
            seq[rank] = seq.get(rank, 0) + 1
            loss = 2.0 / step + 0.01 * rank
            if (rank == 5 and step >= 12) or step >= 13:
                loss = math.nan  # rank 5 first, every rank one step later
            records.append(StepRecord(
                run=run, rank=rank, seq=seq[rank], time=t0 + step, world_size=world,
                host="node0", pid=100 + rank, step=step, epoch=None, metrics={"loss": loss},
            ))  # fmt: skip
    post(server, records)
    server.wait_for("step 20 stored", lambda: stored_up_to(server, run, world, 20))
    for size, tag in ((DESKTOP, "desktop"), (PHONE, "phone")):
        w = page_at(browser, size)
        page = open_run(w, server, run, "&view=ranks")
        loss = series(page, "loss")
        marked = {n: s["markers"] for n, s in loss.items() if s["markers"]}
        assert marked == {"rank 5": [["NaN", 12]]}
        first = page.evaluate(
            "() => window.rankwatch.charts.get('loss').chart.getOption().series"
            ".find((s) => s.name === 'rank 5').markPoint.data[0].label"
        )
        assert first["formatter"] == "first NaN: rank 5" and first["fontWeight"] == "bold"
        labelled = sorted(n for n, s in loss.items() if s["endLabel"])
        assert labelled == ["rank 5"]  # the others would cover it: counted instead
        info = page.inner_text(".chart-card .chart-info")
        assert "+7 ranks NaN" in info
        assert page.inner_text("#banner").startswith("rank 5 · loss since step 12")
        shoot(page, artifacts, f"panels-nan-storm-{tag}")
        close(w)


AXIS_JS = """(metric) => {
  const c = window.rankwatch.charts.get(metric);
  const axis = c.chart.getModel().getComponent('yAxis', 0).axis;
  let values = c.base.band.min.concat(c.base.band.max);
  for (const line of c.base.lines.values()) values = values.concat(line.values);
  values = values.filter(Number.isFinite);
  return {name: c.chart.getOption().yAxis[0].name, extent: axis.scale.getExtent(),
          type: axis.type, lo: Math.min(...values), hi: Math.max(...values),
          title: c.title.textContent, hidden: c.el.hidden, constant: c.constEl.textContent,
          constantShown: !c.constEl.hidden};
}"""


def test_units_zero_based_axes_constants_band_and_rank_errors(
    server: Server,  # noqa: F811
    browser: Browser,
    artifacts: Path,
) -> None:
    run = "msrun4-small-faults"
    feed = Feed(server, run, CLEAN)
    feed.steps(1, 50)
    server.wait_for("step 50 stored", lambda: stored_up_to(server, run, 4, 50))
    for size, tag in ((DESKTOP, "desktop"), (PHONE, "phone")):
        w = page_at(browser, size)
        page = open_run(w, server, run)
        heat_ready(page, 50)
        throughput = page.evaluate(AXIS_JS, "throughput")
        assert throughput["name"] == "samples/s" and throughput["title"] == "throughput (samples/s)"
        for metric in ("step_time", "data_time"):
            axis = page.evaluate(AXIS_JS, metric)
            assert axis["name"] == "s" and axis["extent"][0] >= 0, (metric, axis)
        for metric in ("loss", "throughput", "step_time"):
            assert page.evaluate(AXIS_JS, metric)["extent"][0] >= 0, metric
        lr = page.evaluate(AXIS_JS, "lr")
        assert lr["constantShown"] and lr["hidden"] and lr["constant"] == "lr 3.0e-4, constant"
        interval = page.evaluate(
            "() => window.rankwatch.heatmap.chart.getOption().xAxis[0].axisLabel.interval"
        )
        assert interval >= 1  # 50 step labels do not fit side by side
        assert "0 drawn one by one" not in page.inner_text("body")
        shoot(page, artifacts, f"panels-small-faults-{tag}")

        if tag == "phone":  # a phone keeps the controls behind a button
            page.click("#controls-toggle")
        page.fill("#select-input", "foo, 99")
        page.press("#select-input", "Enter")
        page.wait_for_selector("#select-error:not([hidden])")
        error = page.inner_text("#select-error")
        assert '"foo" is not a rank' in error and "rank 99 not in this run (ranks 0–3)" in error
        assert page.evaluate("() => [...window.rankwatch.state.selected]") == []
        shoot(page, artifacts, f"panels-rank-error-{tag}")
        close(w)

    w = page_at(browser, DESKTOP)
    page = open_run(w, server, run, "&view=band&log=1")
    info = page.inner_text(".chart-card .chart-info")
    assert "band: 4 ranks, p5–p95 not meaningful" in info and "drawn one by one" not in info
    assert "p5–p95" not in series(page, "loss")
    loss = page.evaluate(AXIS_JS, "loss")
    lo, hi = loss["extent"]
    assert loss["type"] == "log"
    # fitted to the data, not rounded out to whole decades
    room = (loss["hi"] / loss["lo"]) ** 0.1
    assert lo >= loss["lo"] / room and hi <= loss["hi"] * room, loss
    shoot(page, artifacts, "panels-band-4-ranks-log-desktop")

    feed.steps(51, 55, lr=1e-4)  # the schedule moves: the line becomes a chart
    page.wait_for_function("() => !window.rankwatch.charts.get('lr').el.hidden")
    assert page.evaluate(AXIS_JS, "lr")["constantShown"] is False
    heat_ready(page, 55)  # the heatmap follows the stream to the same step
    shoot(page, artifacts, "panels-lr-changed-desktop")
    close(w)
