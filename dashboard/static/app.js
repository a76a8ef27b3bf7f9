// rankwatch dashboard: wires the REST views, the live stream and the page's parts together.
// State that a link should reproduce (run, selected ranks, zoom, log scale, smoothing, view)
// lives in the URL hash. Tests read window.rankwatch (charts, state, firstDrawn).

import { bindActions, runIsLive, setLive, showActions } from './actions.js';
import { MetricChart } from './charts.js';
import { flaggedRanks, spanOf } from './chartset.js';
import { bindControls, syncControls } from './controls.js';
import { hardwareView } from './hardware.js';
import { Heatmap } from './heatmap.js';
import { NodeMap } from './nodemap.js';
import { PAGED_RANKS, rankPager } from './rankpage.js';
import { incidentView } from './incidentview.js';
import * as incidents from './incidents.js';
import * as panels from './panels.js';
import { refView } from './refrun.js';
import { readUrl, writeUrl } from './urlstate.js';
import { STALE, api, debounce, formatRanks, mergeRanks, newestOnly, runPath, throttle } from './util.js';

const REDRAW_INTERVAL_MS = 250; // at most 4 redraws a second, however fast points arrive
const RUNS_POLL_MS = 3000;
const RANKS_POLL_MS = 2000;
const ALERTS_POLL_MS = 3000;
const INCIDENTS_POLL_MS = 5000; // the stream pushes each change; this catches a missed one
// The heatmap is re-read when the stream's step moves past the one it shows, at most this
// often; heatmaps of many ranks cost more to redraw.
const HEATMAP_REFRESH_MS = 1000;
const HEATMAP_REFRESH_MANY_MS = 12000;
const MANY_RANKS = 64;
const MAX_DRILL_SELECTED = 64; // a node's ranks the charts draw when it is picked on the map
const ZOOM_REFETCH_DELAY_MS = 300;
const COMPACT_FACTOR = 3; // refetch a series once live points made it this many times too long
const COMPACT_MIN_INTERVAL_MS = 10000;
// Points the aggregator had before this page subscribed but had not yet flushed to the store
// are in neither the first read nor the stream: read again a little later to catch them.
const CATCH_UP_MS = [1500, 5000];

const $ = (id) => document.getElementById(id);

const state = {
  run: null,
  runs: [],
  serverOffset: 0, // server clock minus this browser's, seconds
  metrics: [],
  selected: new Set(),
  log: false,
  ema: 0,
  view: 'auto',
  zoom: null, // {start, end} in steps, or null for the whole run
  heatMetric: null,
  ranks: [],
  divergent: new Map(), // metric -> Set of ranks flagged now
  firing: [],
  events: [],
  sort: { key: 'rank', dir: 1 },
  connected: false,
  allRanks: false, // at phone width: every rank in the table, not only those that matter
  ref: null, // the reference run named in the URL; null: the previous run of this job
  refNone: false, // no reference at all
  big: false, // more than PAGED_RANKS ranks: the table is paged on the server, a node map
};
const charts = new Map(); // metric -> MetricChart
const firstDrawn = {}; // metric -> {step: Date.now() when the step was first drawn}
let heatmap = null;
let nodemap = null; // nodemap.js, in place of the heatmap for a run of many ranks
let pager = null; // rankpage.js: the table of a run of many ranks, a page at a time
let hardware = null; // hardware.js: the telemetry section and the table's hardware columns
let stream = null;
let loading = 0; // > 0 while series are being (re)loaded: live messages are kept and replayed
let buffered = [];
let lastRedraw = 0;
let redrawTimer = null;
let extentKey = '';
let syncingZoom = false;
let lastHeatmap = 0;
const lastCompact = new Map();

const serverNow = () => Date.now() / 1000 + state.serverOffset;
const currentRun = () => state.runs.find((r) => r.run === state.run) || null;
// A run of many ranks holds one page of its table: its state alone then says.
const runLive = () => runIsLive(currentRun(), state.big ? null : state.ranks);
const incidentUi = incidentView({ state, serverNow, restyle, live: runLive });
const refUi = refView({
  state, charts, showError, scheduleRedraw, picker: $('ref'), onChange: () => writeUrl(state),
});

// --- what the charts ask the app ---------------------------------------------------------

const app = {
  state,
  highlighted: () => flaggedRanks(state.divergent),
  extent: () => spanOf(charts),
  // A rank's part in the run's incident (culprit, affected, terminated, or null), and the
  // chart style that goes with it: the charts ask these before their divergent colours.
  rankRole: incidents.rankRole,
  roleStyle: (rank) => incidents.roleStyle(rank, state.selected),
  ranksTotal() {
    return state.big && pager.answer ? pager.answer.total : state.ranks.length;
  },
  tableMetric() {
    return state.metrics.includes('loss') ? 'loss' : state.metrics[0] || 'loss';
  },
  // end, crash and restart markers on the step axis, one line per (kind, step).
  stepEvents() {
    const groups = new Map();
    const started = new Set();
    for (const ev of state.events) {
      const name = ev.event ?? ev.kind;
      let kind = null;
      if (name === 'crash' || name === 'end' || name === 'restart') kind = name;
      else if (name === 'start') {
        if (started.has(ev.rank) || (ev.step ?? 0) > 0) kind = 'restart';
        started.add(ev.rank);
      }
      if (!kind || ev.step === null || ev.step === undefined) continue;
      const key = `${kind}@${ev.step}`;
      if (!groups.has(key)) groups.set(key, { kind, step: ev.step, ranks: [] });
      const group = groups.get(key);
      if (!group.ranks.includes(ev.rank)) group.ranks.push(ev.rank); // a start and its restart
    }
    return [...groups.values()].map((g) => ({
      ...g,
      label: g.ranks.length === 1 ? `${g.kind} r${g.ranks[0]}` : `${g.kind} ×${g.ranks.length}`,
    }));
  },
  toggleRank(rank) {
    if (rank === undefined || rank === null || Number.isNaN(rank)) return;
    if (state.selected.has(rank)) state.selected.delete(rank);
    else state.selected.add(rank);
    selectionChanged();
  },
  onZoom(startPct, endPct, source) {
    if (syncingZoom) return;
    const [lo, hi] = app.extent();
    if (!Number.isFinite(lo)) return;
    state.zoom = startPct <= 0.01 && endPct >= 99.99 ? null : {
      start: Math.floor(lo + ((hi - lo) * startPct) / 100),
      end: Math.ceil(lo + ((hi - lo) * endPct) / 100),
    };
    syncingZoom = true;
    try {
      for (const c of charts.values()) {
        if (c !== source) c.chart.dispatchAction({ type: 'dataZoom', start: startPct, end: endPct }, { silent: true });
      }
    } finally {
      syncingZoom = false;
    }
    writeUrl(state);
    refetchZoom();
  },
};

// --- loading -----------------------------------------------------------------------------

function maxPoints(chart) {
  return Math.max(200, Math.min(4000, Math.round((chart.el.clientWidth || 800) * 1.5)));
}

async function loadSeries(chart, window = null) {
  const params = {
    metric: chart.metric,
    view: state.view,
    max_points: maxPoints(chart),
    ranks: state.selected.size ? formatRanks(state.selected) : null,
    format: 'bin', // float64 columns: a million points cost no JSON formatting or parsing
    minmax: false, // the chart draws step and value only: half the bytes
  };
  if (window) Object.assign(params, { start: window.start, end: window.end });
  const resp = await api(runPath(state.run, 'series'), params);
  if (resp.run !== state.run || !charts.has(chart.metric)) return;
  chart.load(resp, window);
}

async function withLiveBuffer(work) {
  loading += 1;
  try {
    await work();
  } finally {
    loading -= 1;
    if (!loading) {
      const replay = buffered;
      buffered = [];
      for (const msg of replay) handle(msg);
    }
    scheduleRedraw();
  }
}

async function reloadAllSeries() {
  await withLiveBuffer(async () => {
    await Promise.all([...charts.values()].map(async (c) => {
      await loadSeries(c);
      if (state.zoom) await loadSeries(c, state.zoom);
    }));
  });
}

async function loadMetrics() {
  const resp = await api(runPath(state.run, 'metrics'));
  state.metrics = resp.metrics;
  const box = $('charts');
  const added = [];
  for (const metric of state.metrics) {
    if (!charts.has(metric)) {
      const chart = new MetricChart(metric, box, app);
      charts.set(metric, chart);
      added.push(chart);
    }
    box.append(charts.get(metric).card); // keep the server's chart order
  }
  $('empty').hidden = state.metrics.length > 0;
  renderHeatPicker();
  for (const chart of added) refUi.attach(chart);
  return added;
}

// `flagged`: the entries whose divergent lists count (a paged table's rows are not all of them).
function applyRanks(ranks, flagged = ranks) {
  state.ranks = ranks;
  const divergent = new Map();
  for (const r of flagged) {
    for (const metric of r.divergent || []) {
      if (!divergent.has(metric)) divergent.set(metric, new Set());
      divergent.get(metric).add(r.rank);
    }
  }
  const key = (m) => JSON.stringify([...m].map(([k, v]) => [k, [...v].sort((a, b) => a - b)]).sort());
  if (key(divergent) !== key(state.divergent)) {
    state.divergent = divergent;
    for (const c of charts.values()) {
      c.needsFull = true;
      const missing = [...(divergent.get(c.metric) || [])].some((r) => !c.base.lines.has(r));
      if (c.mode === 'band' && missing) loadSeries(c).then(scheduleRedraw).catch(showError);
    }
    scheduleRedraw();
  }
  renderPanels();
}

// The reads the stream repeats, each applied only if no later one of it began (newestOnly).
const [readRanks, readAlerts, readEvents, readRuns] = [1, 2, 3, 4].map(() => newestOnly(api));

async function loadRanks() {
  if (!state.run) return;
  if (state.big) {
    await Promise.all([pager.load(), loadNodes()]);
    return;
  }
  const resp = await readRanks(runPath(state.run, 'ranks'));
  if (resp !== STALE && resp.run === state.run) applyRanks(resp.ranks);
}

async function loadAlerts() {
  if (!state.run) return;
  const run = state.run;
  const resp = await readAlerts('/api/alerts', { run });
  if (resp === STALE || run !== state.run) return;
  state.firing = resp.firing;
  panels.renderBanner($('banner'), state.firing, serverNow(), state.ranks);
  incidentUi.renderAlertsToggle();
}

async function loadEvents() {
  if (!state.run) return;
  const run = state.run;
  const resp = await readEvents(runPath(run, 'events'));
  if (resp === STALE || run !== state.run) return;
  state.events = resp.events;
  for (const c of charts.values()) c.needsFull = true;
  scheduleRedraw();
}

// A page's rows as rank entries (what the chips, banner and charts read), and every flagged
// rank of the run for the charts' colours, on this page or not.
function applyRankPage(resp) {
  const metric = resp.metric;
  const entry = (r) => ({ ...r, values: { [metric]: r.value }, z: { [metric]: r.z } });
  applyRanks(resp.rows.map(entry), resp.divergent);
}

async function loadNodes() {
  if (!state.run) return;
  const resp = await api(runPath(state.run, 'nodes'), { metric: app.tableMetric() });
  if (resp.run !== state.run) return;
  nodemap.load(resp);
  const by = resp.by === 'host' ? 'node' : `block of ${resp.block} ranks`;
  $('nodemap-info').textContent = `${resp.cells.toLocaleString('en-US')} tiles, one per ${by}, coloured by its worst rank; click one for its ranks`;
}

// A node picked on the map: the table lists its ranks and the charts draw them.
async function drillNode(cell) {
  const resp = await pager.drill(cell);
  if (!resp) return;
  state.selected = new Set(resp.rows.slice(0, MAX_DRILL_SELECTED).map((r) => r.rank));
  selectionChanged();
}

async function loadHeatmap() {
  const metric = heatMetric();
  if (state.big) return;
  if (!state.run || !metric) return;
  lastHeatmap = Date.now();
  const params = { metric };
  if (state.zoom) Object.assign(params, { start: state.zoom.start, end: state.zoom.end });
  const resp = await api(runPath(state.run, 'heatmap'), params);
  if (resp.run !== state.run || resp.metric !== heatMetric()) return;
  heatmap.load(resp);
  renderPanels(); // the table's peak z comes from this read
  // The store runs a flush behind the stream: read again until the heatmap reaches its step.
  if (!state.zoom && heatmap.lastStep !== null && heatmap.lastStep < app.extent()[1]) refreshHeatmapSoon();
}

const refreshHeatmapSoon = throttle(() => {
  if (state.big) return;
  const many = state.ranks.length > MANY_RANKS;
  if (many && Date.now() - lastHeatmap < HEATMAP_REFRESH_MANY_MS) return;
  loadHeatmap().catch(showError);
}, HEATMAP_REFRESH_MS);

async function loadRuns() {
  const resp = await readRuns('/api/runs');
  if (resp === STALE) return;
  if (typeof resp.now === 'number') state.serverOffset = resp.now - Date.now() / 1000;
  state.runs = resp.runs;
  if (!state.run || !state.runs.some((r) => r.run === state.run)) {
    const first = state.runs[0];
    if (first && first.run !== state.run) return selectRun(first.run, false);
  }
  panels.renderRunPicker($('run'), state.runs, state.run);
  refUi.renderPicker();
  tick();
}

async function selectRun(run, resetView = true) {
  closeStream();
  for (const c of charts.values()) c.dispose();
  charts.clear();
  heatmap.clear();
  Object.assign(state, { run, metrics: [], ranks: [], divergent: new Map(), firing: [], events: [] });
  const listed = state.runs.find((r) => r.run === run);
  state.big = Math.max(listed?.ranks ?? 0, listed?.world_size ?? 0) > PAGED_RANKS;
  pager.reset();
  nodemap.clear();
  $('nodemap-card').hidden = !state.big;
  $('heatmap-card').hidden = state.big;
  $('rank-pager').hidden = !state.big;
  incidentUi.reset();
  showActions(run);
  if (resetView) Object.assign(state, { zoom: null, selected: new Set(), heatMetric: null });
  window.rankwatch.ready = false;
  writeUrl(state);
  panels.renderRunPicker($('run'), state.runs, state.run);
  hardware.selectRun(run).catch(showError); // its own reads: the training charts do not wait
  if (!run) return;
  openStream(); // before the first read, so nothing published meanwhile is missed
  // One failed read (say the store has not flushed a brand-new run yet) must not leave the
  // page half-built: report it and go on; the stream and the polls fill in the rest.
  const attempt = (p) => p.catch(showError);
  await withLiveBuffer(async () => {
    await attempt(loadMetrics());
    await Promise.all([loadRanks(), loadEvents(), loadAlerts(), incidentUi.load(), reloadAllSeries()].map(attempt));
  });
  attempt(refUi.load()); // not awaited: a large reference must not hold back this run's stream
  await attempt(loadHeatmap());
  for (const ms of CATCH_UP_MS) {
    setTimeout(() => { if (state.run === run) reloadAllSeries().catch(showError); }, ms);
  }
  clearTimeout(redrawTimer);
  redraw(); // draw now, so "ready" means the charts show the data
  window.rankwatch.ready = true;
  tick();
}

// --- live stream -------------------------------------------------------------------------

function closeStream() {
  if (stream) stream.close();
  stream = null;
}

function openStream() {
  // a paged table reads its rows itself: the stream says only that ranks changed
  const tables = state.big ? '&ranks=changes' : '';
  const es = new EventSource(`/api/stream?run=${encodeURIComponent(state.run)}${tables}`);
  let hellos = 0;
  stream = es;
  es.addEventListener('hello', () => {
    setConnected(true);
    hellos += 1;
    if (hellos > 1) reloadAllSeries().catch(showError); // reconnected: fill what we missed
  });
  es.addEventListener('feed', (e) => {
    const messages = JSON.parse(e.data);
    window.rankwatch.frames += 1;
    for (const msg of messages) handle(msg);
  });
  es.addEventListener('resync', () => reloadAllSeries().catch(showError));
  es.addEventListener('closed', () => setConnected(false));
  es.onerror = () => setConnected(false);
}

function setConnected(on) {
  state.connected = on;
  const node = $('conn');
  node.className = on ? 'conn on' : 'conn off';
  node.title = on ? 'live: connected' : 'live: disconnected, retrying';
}

const refreshRanksSoon = throttle(() => loadRanks().catch(showError), 1000);
const refreshAlertsSoon = throttle(() => loadAlerts().catch(showError), 1000);
const refreshIncidentsSoon = throttle(() => incidentUi.load().catch(showError), 1000);
const refreshEventsSoon = throttle(() => { loadEvents().catch(showError); loadRuns().catch(showError); }, 1000);
const refreshMetricsSoon = throttle(async () => {
  const added = await loadMetrics();
  await withLiveBuffer(() => Promise.all(added.map((c) => loadSeries(c))));
}, 1000);

function handle(msg) {
  if (msg.run !== undefined && msg.run !== state.run) return;
  if (loading) { // replayed once the reads in flight have landed, so nothing is overwritten
    buffered.push(msg);
    return;
  }
  switch (msg.type) {
    case 'points': {
      const chart = charts.get(msg.metric);
      if (!chart) {
        refreshMetricsSoon();
        return;
      }
      chart.append(msg.points || []);
      const run = currentRun();
      if (run) run.last_time = Math.max(run.last_time || 0, serverNow());
      maybeCompact(chart);
      refUi.refresh(); // the comparison follows this run's steps; the reference stays
      scheduleRedraw();
      if (!state.zoom && msg.points?.some(([, step]) => step > (heatmap.lastStep ?? -Infinity))) refreshHeatmapSoon();
      break;
    }
    case 'ranks':
      if (state.big || !Array.isArray(msg.ranks)) refreshRanksSoon();
      else if (msg.delta) applyRanks(mergeRanks(state.ranks, msg.ranks, msg.removed || []));
      else applyRanks(msg.ranks); // the whole table, fresh
      break;
    case 'divergence':
    case 'divergences': // a step's divergences beyond the first few, counted
      refreshRanksSoon();
      refreshAlertsSoon();
      break;
    case 'alert':
      refreshAlertsSoon();
      break;
    case 'event':
    case 'events': // a tick's events beyond the first few, counted
      refreshEventsSoon();
      break;
    case 'telemetry':
      hardware?.onMessage(msg);
      break;
    case 'incident':
      if (msg.incident && msg.incident.run !== state.run) break;
      if (!incidentUi.onMessage(msg)) refreshIncidentsSoon();
      break;
    case 'command': // the card lists what was done about its incident, with the answers
      if (msg.run === state.run && msg.command && msg.command.incident) refreshIncidentsSoon();
      break;
    default:
      break;
  }
}

function maybeCompact(chart) {
  if (chart.pointCount() < COMPACT_FACTOR * maxPoints(chart)) return;
  if (Date.now() - (lastCompact.get(chart.metric) || 0) < COMPACT_MIN_INTERVAL_MS) return;
  lastCompact.set(chart.metric, Date.now());
  withLiveBuffer(() => loadSeries(chart)).catch(showError);
}

// --- drawing -----------------------------------------------------------------------------

function scheduleRedraw() {
  if (redrawTimer) return;
  const wait = Math.max(0, lastRedraw + REDRAW_INTERVAL_MS - Date.now());
  redrawTimer = setTimeout(redraw, wait);
}

function redraw() {
  redrawTimer = null;
  lastRedraw = Date.now();
  const [lo, hi] = app.extent();
  const key = `${lo}:${hi}`;
  const extentChanged = key !== extentKey;
  extentKey = key;
  for (const c of charts.values()) {
    if (!c.needsFull && !c.dirty.size) {
      if (extentChanged) c.onExtent();
      continue;
    }
    const steps = c.render();
    const seen = firstDrawn[c.metric] || (firstDrawn[c.metric] = {});
    const now = Date.now();
    for (const s of steps) if (!(s in seen)) seen[s] = now;
  }
}

// Ranks' roles changed: every chart restyles, the table and chips follow.
function restyle() {
  for (const c of charts.values()) c.needsFull = true;
  hardware?.restyle();
  scheduleRedraw();
  renderPanels();
}

function renderPanels() {
  panels.renderBanner($('banner'), state.firing, serverNow(), state.ranks); // its "z now"
  panels.renderLegend($('legend'), app);
  if (state.big) pager.render($('rank-head'), $('rank-body'), serverNow());
  else {
    panels.renderTableHead($('rank-head'), app);
    panels.renderTable($('rank-body'), app, serverNow());
  }
  hardware?.decorateTable($('rank-head'), $('rank-body'));
  const minor = incidents.markRanks($('rank-body'), $('legend'), state.ranks, app.highlighted(), state.selected);
  const toggle = $('all-ranks');
  toggle.hidden = minor === 0 || state.big; // a paged table shows its whole page
  toggle.textContent = state.allRanks ? 'show the ranks that matter' : `show all ${state.ranks.length} ranks`;
  $('rank-table').classList.toggle('all', state.allRanks || state.big);
  $('rank-table').classList.toggle('paged', state.big);
  markTableScroll();
}

// A table wider than its box scrolls sideways inside it (the page itself never does): say so,
// or a phone shows the first columns with nothing telling that more follow.
function markTableScroll() {
  const wrap = $('rank-wrap');
  $('rank-scroll-hint').hidden = wrap.scrollWidth <= wrap.clientWidth + 1;
}

function renderHeatPicker() {
  const select = $('heat-metric');
  const current = heatMetric();
  select.replaceChildren(...state.metrics.map((m) => {
    const opt = document.createElement('option');
    opt.value = m;
    opt.textContent = m;
    return opt;
  }));
  if (current) select.value = current;
}

function heatMetric() {
  return state.metrics.includes(state.heatMetric) ? state.heatMetric : app.tableMetric();
}

function tick() {
  panels.renderFreshness($('freshness'), $('run-state'), currentRun(), serverNow());
  setLive(runLive());
  panels.renderBanner($('banner'), state.firing, serverNow(), state.ranks);
  incidentUi.tick();
}

function bindLayoutControls() {
  $('all-ranks').addEventListener('click', () => {
    state.allRanks = !state.allRanks;
    renderPanels();
  });
  $('controls-toggle').addEventListener('click', () => {
    const open = document.body.classList.toggle('controls-open');
    $('controls-toggle').setAttribute('aria-expanded', String(open));
  });
}

function showError(err) {
  const node = $('error');
  node.textContent = `Could not load: ${err.message || err}`;
  node.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { node.hidden = true; }, 8000);
}

const refetchZoom = debounce(() => {
  withLiveBuffer(() => Promise.all([...charts.values()].map((c) => {
    if (!state.zoom) {
      c.dropDetail();
      return null;
    }
    return loadSeries(c, state.zoom);
  }))).then(() => loadHeatmap()).catch(showError);
}, ZOOM_REFETCH_DELAY_MS);

const selectionChanged = debounce(() => {
  writeUrl(state);
  $('select-input').value = formatRanks(state.selected);
  for (const c of charts.values()) {
    c.needsFull = true;
    const missing = [...state.selected].some((r) => !c.base.lines.has(r));
    if (c.mode === 'band' && missing) withLiveBuffer(() => loadSeries(c)).catch(showError);
  }
  renderPanels();
  scheduleRedraw();
}, 50);

async function main() {
  window.rankwatch = {
    state, charts, firstDrawn, app, ready: false, frames: 0, ref: refUi.ref,
    get heatmap() { return heatmap; }, get nodemap() { return nodemap; }, get pager() { return pager; },
  };
  readUrl(state);
  syncControls(state);
  bindControls({
    state, charts, app, heatmap: () => heatmap, selectRun, reloadAllSeries, scheduleRedraw,
    refetchZoom, selectionChanged, loadHeatmap, renderPanels, showError, loadRef: refUi.load,
  });
  heatmap = new Heatmap($('heatmap'), app);
  pager = rankPager({ state, app, onRows: applyRankPage, showError });
  pager.bind(() => {
    nodemap.unpick();
    state.selected = new Set();
    selectionChanged();
  });
  nodemap = new NodeMap($('nodemap-canvas'), $('nodemap-legend'), $('nodemap-readout'),
    (cell) => drillNode(cell).catch(showError));
  hardware = hardwareView({ state, toggleRank: app.toggleRank, roleStyle: app.roleStyle, redrawTable: renderPanels });
  window.addEventListener('resize', debounce(() => { nodemap.draw(); markTableScroll(); }, 150));
  incidentUi.bind();
  bindActions(() => state.run);
  bindLayoutControls();
  setInterval(tick, 1000);
  setInterval(() => loadRuns().catch(showError), RUNS_POLL_MS);
  // The stream pushes the rank table and then its changes; poll only while it is down.
  setInterval(() => { if (!state.connected) loadRanks().catch(showError); }, RANKS_POLL_MS);
  setInterval(() => loadAlerts().catch(showError), ALERTS_POLL_MS);
  setInterval(() => incidentUi.load().catch(showError), INCIDENTS_POLL_MS);
  const resp = await api('/api/runs');
  if (typeof resp.now === 'number') state.serverOffset = resp.now - Date.now() / 1000;
  state.runs = resp.runs;
  const wanted = state.runs.some((r) => r.run === state.run) ? state.run : state.runs[0]?.run ?? null;
  await selectRun(wanted, false);
  if (!wanted) window.rankwatch.ready = true;
}

main().catch(showError);
