"""The page in real headless Chromium, against a real `rankwatch serve` fed by real agents.

Assertions read ECharts' own options through ``window.rankwatch`` (series names, line widths,
markers) rather than pixels; screenshots go to test-artifacts/ (or $RANKWATCH_ARTIFACTS) for a
person to look at.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import pytest
from rankwatch.agent.wire.records import StepRecord, to_wire
from rankwatch.dashboard.jsonenc import dumps

from .conftest import BROWSER_MARKS, Watched, fixture_rows
from .procs import Rank, Server

if TYPE_CHECKING:
    from playwright.sync_api import Page

READY_TIMEOUT_MS = 30_000
LIVE_BUDGET_S = 2.0  # a logged step must be on the chart this soon, without a reload

pytestmark = BROWSER_MARKS

# Every series of a chart as the test needs it: name, width, points, end label, markers.
SERIES_JS = """(metric) => {
  const chart = window.rankwatch.charts.get(metric);
  if (!chart) return null;
  return chart.chart.getOption().series.map((s) => ({
    id: s.id, name: s.name,
    width: s.lineStyle ? s.lineStyle.width : null,
    color: s.lineStyle ? s.lineStyle.color : null,
    steps: (s.data || []).map((p) => p[0]),
    endLabel: !!(s.endLabel && s.endLabel.show),
    markers: ((s.markPoint && s.markPoint.data) || []).map((m) => [m.name, m.coord[0]]),
  }));
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("serve") / "data")
    yield srv
    srv.stop()
    shutil.copy(srv.log_path, artifacts / "browser-serve.log")


@pytest.fixture
def watched(new_page: Callable[..., Watched]) -> Iterator[Watched]:
    w = new_page({"width": 1400, "height": 1000})
    yield w
    assert w.errors == [], f"errors on the page: {w.errors}"


def open_run(w: Watched, server: Server, run: str, extra: str = "") -> Page:
    w.page.goto(f"{server.url}/#run={quote(run, safe='')}{extra}")
    try:
        w.page.wait_for_function(
            "() => window.rankwatch && window.rankwatch.ready", timeout=READY_TIMEOUT_MS
        )
    except Exception:
        shown = w.page.evaluate("() => document.getElementById('error').textContent")
        server.dump_stacks()
        raise AssertionError(
            f"the page never got ready; it says: {shown!r}\n{server.output[-8000:]}"
        ) from None
    return w.page


def series(page: Page, metric: str) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in page.evaluate(SERIES_JS, metric) or []}


# Hover a chart at (step, value) until its tooltip is up: a redraw may close a tooltip that
# opened just before it, so keep asking rather than sleeping.
SHOW_TIP_JS = """([metric, step, value]) => {
  const c = window.rankwatch.charts.get(metric);
  if (!c) return false;
  const [x, y] = c.chart.convertToPixel({gridIndex: 0}, [step, value]);
  c.chart.dispatchAction({type: 'showTip', x, y});
  return [...document.querySelectorAll('.tt-head')].some(
    (e) => e.textContent.startsWith(metric + ' · step ' + step) && e.offsetParent !== null);
}"""


def show_tooltip(page: Page, metric: str, step: int, value: float) -> None:
    page.wait_for_function(SHOW_TIP_JS, arg=[metric, step, value], polling=250)


def start_ranks(server: Server, run: str, world: int, log_dir: Path) -> list[Rank]:
    return [Rank(server, run, rank, world, log_dir) for rank in range(world)]


def stored_up_to(server: Server, run: str, world: int, step: int, metric: str = "loss") -> bool:
    """Every rank's ``step`` is in the store (the live view runs a flush ahead of it)."""
    got = server.get(f"/api/runs/{quote(run, safe='')}/series", metric=metric)["series"]
    return len(got) == world and all(s["step"][-1:] == [step] for s in got.values())


def firing(server: Server, run: str) -> list[dict[str, Any]]:
    return server.get("/api/alerts", run=run)["firing"]


def test_every_rank_on_one_chart_bad_rank_named_and_live(
    server: Server, watched: Watched, artifacts: Path, tmp_path: Path
) -> None:
    run = "msrun4-rank2-shifted"
    trace: dict[int, dict[int, float]] = {}
    for step, rank, loss in fixture_rows():
        trace.setdefault(step, {})[rank] = loss
    ranks = start_ranks(server, run, 4, tmp_path)
    try:
        for step in range(1, 60):
            for rank, agent in enumerate(ranks):
                agent.log(step, loss=trace[step][rank])
        server.wait_for(
            "the divergence alert on rank 2",
            lambda: [a for a in firing(server, run) if a["rank"] == 2 and a["metric"] == "loss"],
        )
        server.wait_for("every rank's step 59 stored", lambda: stored_up_to(server, run, 4, 59))
        page = open_run(watched, server, run)
        loss = series(page, "loss")
        drawn = {name: s for name, s in loss.items() if name.startswith("rank ")}
        assert sorted(drawn) == ["rank 0", "rank 1", "rank 2", "rank 3"]
        for s in drawn.values():
            assert s["steps"] == list(range(1, 60))
        assert drawn["rank 2"]["width"] > max(drawn[f"rank {r}"]["width"] for r in (0, 1, 3))
        assert drawn["rank 2"]["endLabel"]
        assert not any(drawn[f"rank {r}"]["endLabel"] for r in (0, 1, 3))
        banner = page.inner_text("#banner")
        assert "rank 2 · loss" in banner and "since step" in banner
        page.screenshot(path=artifacts / "four-ranks-rank2-flagged.png", full_page=True)

        # Live: step 60 reaches the chart without a reload, within the budget.
        page.evaluate("() => { window.__sameDocument = true; }")
        logged_at = [agent.log(60, loss=trace[60][rank]) for rank, agent in enumerate(ranks)]
        page.wait_for_function(
            "() => { const c = window.rankwatch.charts.get('loss');"
            " return c && c.base.lines.get(3) && c.base.lines.get(3).steps.includes(60)"
            " && window.rankwatch.firstDrawn.loss && window.rankwatch.firstDrawn.loss[60]; }",
            timeout=LIVE_BUDGET_S * 1000 + 3000,
        )
        drawn_ms = page.evaluate("() => window.rankwatch.firstDrawn.loss[60]")
        latency = drawn_ms / 1000 - max(logged_at)
        assert latency < LIVE_BUDGET_S, f"step 60 took {latency:.2f} s to be drawn"
        assert page.evaluate("() => window.__sameDocument") is True
        page.wait_for_function(  # every rank's point, not only the first, reaches the chart
            "() => window.rankwatch.charts.get('loss').chart.getOption().series"
            ".filter((s) => s.name.startsWith('rank '))"
            ".every((s) => s.data.length && s.data[s.data.length - 1][0] === 60)",
            timeout=LIVE_BUDGET_S * 1000,
        )

        # Tooltip at step 40: ranks sorted by value, with z; rank 2 first and far off.
        show_tooltip(page, "loss", 40, 1.0)
        rows = page.locator(".tt-row").all_inner_texts()
        assert rows[0].split()[:2] == ["rank", "2"]
        assert float(rows[0].split("z")[-1]) > 3
        page.screenshot(path=artifacts / "four-ranks-tooltip.png")

        # Zoom to steps ~20-40: every chart follows, the window is re-read, the URL keeps it.
        page.evaluate(
            "() => window.rankwatch.charts.get('loss').chart"
            ".dispatchAction({type: 'dataZoom', start: 30, end: 60})"
        )
        page.wait_for_function(
            "() => [...window.rankwatch.charts.values()].every((c) => c.detail)"
            " && location.hash.includes('zoom=')"
        )
        zoom = page.evaluate("() => window.rankwatch.state.zoom")
        assert 15 <= zoom["start"] <= 22 and 33 <= zoom["end"] <= 40
        detail = page.evaluate("() => window.rankwatch.charts.get('step_time').detail")
        assert (detail["start"], detail["end"]) == (zoom["start"], zoom["end"])
        page.click("#reset-zoom")
        page.wait_for_function(
            "() => !window.rankwatch.state.zoom && !location.hash.includes('zoom')"
        )

        # Select rank 1 in the table: it is drawn bold and blue, and the URL keeps it.
        page.click("#rank-body tr[data-rank='1']")
        page.wait_for_function("() => location.hash.includes('sel=1')")
        page.wait_for_function(
            "() => window.rankwatch.charts.get('loss').chart.getOption().series"
            ".find((s) => s.name === 'rank 1').lineStyle.width === 2"
        )
        link = page.url
        other = watched.page.context.new_page()
        other.goto(link)
        other.wait_for_function("() => window.rankwatch && window.rankwatch.ready")
        assert other.evaluate("() => [...window.rankwatch.state.selected]") == [1]
        assert series(other, "loss")["rank 1"]["width"] == 2
        other.close()
    finally:
        for agent in ranks:
            agent.close()


def test_markup_in_names_stays_inert(
    server: Server, watched: Watched, artifacts: Path, tmp_path: Path
) -> None:
    run = "<img src=x onerror=alert(1)>"
    metric = "<img src=x onerror=alert(2)>"
    ranks = start_ranks(server, run, 2, tmp_path)
    try:
        for step in range(1, 16):
            for rank, agent in enumerate(ranks):
                agent.log(step, loss=1.0 + 0.01 * rank, **{metric: step * (1 + rank)})
        ranks[1].send(
            {"event": "crash", "step": 15, "info": {"message": "<img src=x onerror=alert(3)>"}}
        )
        server.wait_for("step 15 stored", lambda: stored_up_to(server, run, 2, 15, metric))
        page = open_run(watched, server, run)
        page.wait_for_function("(m) => window.rankwatch.charts.has(m)", arg=metric)
        assert page.locator("#run option:checked").inner_text().startswith(run)
        titles = page.locator(".chart-card h2").all_inner_texts()
        assert any(t.startswith(metric) for t in titles)
        show_tooltip(page, metric, 8, 10.0)
        page.screenshot(path=artifacts / "markup-names-inert.png", full_page=True)
        assert page.evaluate("() => document.querySelectorAll('img').length") == 0
        assert watched.dialogs == []
        assert metric in page.inner_text("body")  # shown, as text
    finally:
        for agent in ranks:
            agent.close()


def test_nan_and_inf_drawn_as_markers(
    server: Server, watched: Watched, artifacts: Path, tmp_path: Path
) -> None:
    run = "nan-run"
    ranks = start_ranks(server, run, 3, tmp_path)
    try:
        for step in range(1, 13):
            for rank, agent in enumerate(ranks):
                value = 2.0 / step + 0.01 * rank
                if rank == 1 and step == 5:
                    value = math.nan
                if rank == 1 and step == 8:
                    value = math.inf
                agent.log(step, loss=value)
        server.wait_for("step 12 stored", lambda: stored_up_to(server, run, 3, 12))
        page = open_run(watched, server, run)
        loss = series(page, "loss")
        assert loss["rank 1"]["markers"] == [["NaN", 5], ["+Inf", 8]]
        assert loss["rank 0"]["markers"] == []
        heat = page.evaluate(
            "() => window.rankwatch.heatmap.chart.getOption().series[0].data"
            ".filter((d) => d[2] > 50).map((d) => [d[0], d[1]])"
        )
        assert heat, "the heatmap shows the non-finite cells"
        page.screenshot(path=artifacts / "nan-run-markers.png", full_page=True)
    finally:
        for agent in ranks:
            agent.close()


def _ingest(server: Server, records: list[StepRecord]) -> None:
    body = {"records": [to_wire(r) for r in records]}
    res = httpx.post(f"{server.url}/api/ingest", json=body, timeout=120)
    res.raise_for_status()
    assert res.json()["rejected"] == 0


def test_1024_ranks_band_mode_stays_responsive(
    server: Server, watched: Watched, artifacts: Path
) -> None:
    run, world, bad = "big-1024", 1024, 777
    seq: dict[int, int] = {}
    t0 = time.time() - 100  # recent: an import this fresh joins the live state

    def steps(lo: int, hi: int) -> list[StepRecord]:
        out = []
        for step in range(lo, hi):
            for rank in range(world):
                seq[rank] = seq.get(rank, 0) + 1
                noise = 0.02 * math.sin(rank * 12.9898 + step * 78.233)
                loss = (2.0 * math.exp(-step / 60) + 0.3) * (1 + noise)
                if rank == bad and step >= 40:
                    loss *= 2.5
                out.append(StepRecord(
                    run=run, rank=rank, seq=seq[rank], time=t0 + step * 0.1, world_size=world,
                    host=f"node{rank // 8:03d}", pid=100 + rank, step=step, epoch=None,
                    metrics={"loss": loss},
                ))  # fmt: skip
        return out

    for lo in range(1, 81, 10):
        _ingest(server, steps(lo, lo + 10))
    server.wait_for("rank 777 flagged", lambda: [
        a for a in firing(server, run) if a["rank"] == bad])  # fmt: skip
    page = watched.page
    page.add_init_script(
        "window.__longTasks = []; new PerformanceObserver((l) => l.getEntries()"
        ".forEach((e) => window.__longTasks.push(e.duration))).observe({type: 'longtask'});"
    )
    # The renderer's own clocks: on a shared machine wall time stretches with the other
    # processes, the main thread's CPU time (ThreadTime) does not.
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")

    def main_thread() -> tuple[float, float]:  # (CPU s, wall s of its tasks)
        got = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return got["ThreadTime"], got["TaskDuration"]

    started, before = time.monotonic(), main_thread()
    open_run(watched, server, run)
    load_s = time.monotonic() - started
    loss = series(page, "loss")
    assert "median" in loss and "min–max" in loss and "p5–p95" in loss
    lines = [n for n in loss if n.startswith("rank ")]
    assert f"rank {bad}" in lines and len(lines) <= 25
    assert loss[f"rank {bad}"]["width"] > 2
    assert page.evaluate("() => window.rankwatch.heatmap.ranks.length") == world
    assert page.locator("#rank-body tr").count() == world
    # Live steps keep arriving; the page must keep answering quickly: each step drawn costs
    # its main thread under a second of CPU.
    per_step = []
    for lo in range(81, 86):
        cpu = main_thread()[0]
        _ingest(server, steps(lo, lo + 1))
        page.wait_for_function(
            f"() => window.rankwatch.charts.get('loss').base.band.steps.includes({lo})",
            timeout=30_000,
        )
        page.evaluate("() => 1")
        per_step.append(main_thread()[0] - cpu)
    after = main_thread()
    # a task's wall time stretched as the main thread's tasks did over the run, at least 1
    stretch = max(1.0, (after[1] - before[1]) / max(after[0] - before[0], 1e-3))
    longest = max(page.evaluate("() => window.__longTasks") or [0]) / stretch
    page.screenshot(path=artifacts / "band-1024-ranks.png", full_page=True)
    timing = {
        "load_s": round(load_s, 2),
        "longest_task_ms": round(longest),
        "lines": len(lines),
        "stretch": round(stretch, 2),
        "step_cpu_s": [round(c, 3) for c in per_step],
    }
    (artifacts / "band-1024-ranks.json").write_text(json.dumps(timing))
    assert load_s < 20, f"page took {load_s:.1f} s to load"
    assert longest < 2000, f"a {longest:.0f} ms task (CPU, stretch {stretch:.1f}) blocked the page"
    assert max(per_step) < 1.0, f"a live step took {max(per_step):.2f} s of the page's CPU"


HELPERS_JS = """async () => {
  const u = await import('/static/util.js');
  const c = await import('/static/charts.js');
  const p = await import('/static/panels.js');
  const s = await import('/static/chartset.js');
  const chart = (lo, hi) => ({stepExtent: () => [lo, hi]});
  const divergent = new Map([['loss', new Set([3, 1])], ['gn', new Set([1, 7])]]);
  const flagged = [...s.flaggedRanks(divergent)];
  const spans = [s.spanOf(new Map([['a', chart(2, 9)], ['b', chart(0, 5)]])),
    s.spanOf(new Map([['a', chart(4, 4)]]))];
  const node = document.createElement('span');
  const state = document.createElement('span');
  p.renderFreshness(node, state, {last_time: 100, state: 'running'}, 200);
  const stale = node.className;
  p.renderFreshness(node, state, {last_time: 100, state: 'finished'}, 200);
  const finished = node.className;
  p.renderFreshness(node, state, {last_time: 195, state: 'running'}, 200);
  return {
    num: ['NaN', 'Infinity', '-Infinity', 1.5, null, 'constructor'].map((x) => String(u.num(x))),
    fmt: [NaN, Infinity, 0.5, 123456789, 0.0001].map(u.fmt),
    ranks: u.formatRanks(u.parseRanks('7, 0-3,5,x,4')),
    ema: c.ema([1, 1, NaN, 3], 0.5).map((v) => (Number.isNaN(v) ? 'NaN' : +v.toFixed(3))),
    stale, finished, fresh: node.className, text: node.textContent, flagged, spans,
  };
}"""


# Where each end label of a chart is drawn: its text -> the y of its middle, in px.
END_LABELS_JS = """(metric) => {
  const chart = window.rankwatch.charts.get(metric);
  const out = {};
  for (const el of chart.chart.getZr().storage.getDisplayList(true)) {
    const text = el.style && el.style.text;
    if (text !== 'median' && !/^rank \\d+$/.test(text || '')) continue;
    const box = el.getBoundingRect().clone();
    box.applyTransform(el.getComputedTransform());
    out[text] = box.y + box.height / 2;
  }
  return out;
}"""


def test_end_labels_of_lines_that_end_together_stay_apart(
    server: Server, watched: Watched, artifacts: Path
) -> None:
    """Every rank shares one lr, so the drawn culprit's lr line ends on the median's: their
    end labels must be a line apart, not drawn over each other."""
    run, world, bad = "lr-shared", 40, 9
    t0 = time.time() - 100
    records = [
        StepRecord(
            run=run, rank=rank, seq=step, time=t0 + step * 0.1, world_size=world,
            host=f"node{rank // 8}", pid=100 + rank, step=step, epoch=None,
            metrics={"loss": (2.0 + 0.02 * math.sin(rank * 12.9898 + step * 78.233))
                     * (2.5 if rank == bad and step >= 20 else 1.0), "lr": 1e-5 * step},
        )
        for step in range(1, 61) for rank in range(world)
    ]  # fmt: skip
    _ingest(server, records)
    server.wait_for(f"rank {bad} flagged", lambda: [
        a for a in firing(server, run) if a["rank"] == bad])  # fmt: skip
    page = open_run(watched, server, run)
    page.wait_for_function(
        "(n) => { const c = window.rankwatch.charts.get('lr');"
        " return !!c && c.chart.getOption().series.some((s) => s.name === n); }",
        arg=f"rank {bad}",
    )
    labels = page.evaluate(END_LABELS_JS, "lr")
    page.screenshot(path=artifacts / "lr-shared-end-labels.png", full_page=True)
    assert {"median", f"rank {bad}"} <= set(labels), labels
    apart = abs(labels["median"] - labels[f"rank {bad}"])
    assert apart >= 12, f"the lr chart's end labels are {apart:.1f} px apart: {labels}"


def test_page_helpers(server: Server, watched: Watched) -> None:
    watched.page.goto(server.url)
    out = watched.page.evaluate(HELPERS_JS)
    assert out["num"] == ["NaN", "Infinity", "-Infinity", "1.5", "null", "null"]
    assert out["fmt"] == ["NaN", "+Inf", "0.5", "1.235e+8", "1.000e-4"]
    assert out["ranks"] == "0-5,7"
    assert out["ema"] == [1, 1, "NaN", 2.143]
    assert out["stale"] == "fresh stale"  # 100 s without a record, still running: red
    assert out["finished"] == "fresh"  # a finished run is not stale
    assert out["fresh"] == "fresh" and out["text"] == "last record 5 s ago"
    # the answers both chart sections (training and hardware) give their charts
    assert sorted(out["flagged"]) == [1, 3, 7]
    assert out["spans"] == [[0, 9], [4, 5]]  # one step wide at least


# The page's series fetch (binary) against the JSON of the same query, decoded in the page.
BINARY_JS = """async ([run, params]) => {
  const u = await import('/static/util.js');
  const path = u.runPath(run, 'series');
  const asJson = await u.api(path, params);
  const asBin = await u.api(path, {...params, format: 'bin'});
  const norm = (xs) => Array.from(xs, (x) => String(u.num(x)));
  const pick = (r) => ({
    ...Object.fromEntries(Object.entries(r).filter(([k]) => k !== 'series' && k !== 'band')),
    series: Object.fromEntries(Object.entries(r.series).map(([rank, d]) => [rank,
      Object.fromEntries(Object.entries(d).map(([k, v]) => [k, norm(v)]))])),
    band: Object.fromEntries(Object.entries(r.band).map(([k, v]) => [k, norm(v)])),
  });
  return {json: pick(asJson), bin: pick(asBin), typed: asBin.series['1'].value.constructor.name};
}"""


def test_binary_series_decodes_like_json(server: Server, watched: Watched) -> None:
    run, t0 = "bin-run", time.time() - 30
    records = [
        StepRecord(run, rank, step, t0 + step, 3, "h", 1, step, None,
                   {"loss": math.nan if (rank, step) == (1, 4) else
                    math.inf if (rank, step) == (1, 7) else 1.0 / step + rank})
        for rank in range(3) for step in range(1, 301)
    ]  # fmt: skip
    body = {"records": [to_wire(r) for r in records]}  # NaN as "NaN", as in the JSONL
    res = httpx.post(
        f"{server.url}/api/ingest",
        content=dumps(body),
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert res.status_code == 200 and res.json()["rejected"] == 0, res.text
    server.wait_for("step 300 stored", lambda: stored_up_to(server, run, 3, 300))
    watched.page.goto(server.url)
    out = watched.page.evaluate(BINARY_JS, [run, {"metric": "loss"}])
    assert out["typed"] == "Float64Array"
    assert out["bin"] == out["json"]
    assert out["bin"]["series"]["1"]["value"][3:7:3] == ["NaN", "Infinity"]
    assert len(out["bin"]["band"]["median"]) == 300
    out = watched.page.evaluate(BINARY_JS, [run, {"metric": "loss", "max_points": 20, "start": 3}])
    assert out["bin"] == out["json"]
    assert "NaN" in out["bin"]["series"]["1"]["value"]  # downsampled, the NaN survives
