// The hardware section: one chart per telemetry metric (all ranks overlaid, or a band past 32
// ranks, the flagged cards highlighted: MetricChart from charts.js on a time axis), the cards
// grouped by node (a node whose cards are flagged together reads as one node), the hardware
// findings, and temp / util / memory columns added to the rank table. Everything from the wire
// is text (textContent, esc()), never HTML.

import { MetricChart } from './charts.js';
import { flaggedRanks, spanOf } from './chartset.js';
import { api, el, esc, fmt, lowerBound } from './util.js';

const RELOAD_MS = 10000; // telemetry is sampled every 10 s by default: charts re-read as often
const MAX_FINDINGS = 8; // finding lines shown; the rest are counted
// A node's cards flagged together draw their lines on top of each other: their end labels piled
// up into one unreadable block at the chart's right edge. The first few are labelled; the node's
// tile above names every card.
const MAX_END_LABELS = 3;
const TABLE_COLUMNS = [
  { key: 'temp', label: 'temp', show: (r) => (r.temp === undefined ? '' : `${Math.round(r.temp)} °C`) },
  { key: 'util', label: 'util', show: (r) => (r.util === undefined ? '' : `${Math.round(r.util)} %`) },
  { key: 'mem', label: 'memory', show: (r) => memory(r) },
];

const GIB = 2 ** 30;

function memory(r) {
  if (r.mem === undefined) return '';
  const used = `${(r.mem / GIB).toFixed(1)}`;
  return r.mem_total ? `${used} / ${(r.mem_total / GIB).toFixed(0)} GiB` : `${used} GiB`;
}

// 24-hour, as the time axis and the incident card write it (not the browser's "5:23:22 AM").
function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
}

function ruleWord(rule) {
  return { hw_hot: 'hot', hw_clock: 'clock', hw_load: 'load', hw_ecc: 'ECC', hw_health: 'health', hw_throttle: 'slowdown', hw_node: 'node' }[rule] || rule;
}

// A MetricChart whose x axis is time (the "steps" are milliseconds since the epoch).
class HardwareChart extends MetricChart {
  constructor(entry, container, app) {
    super(entry.name, container, app);
    this.card.classList.add('hw-chart');
    this.title.textContent = entry.unit ? `${entry.title} (${entry.unit})` : entry.title;
    this.card.dataset.metric = entry.name;
  }

  load(resp) {
    // Bytes read better as GiB (memory) and MiB/s (network): the axis is in those units.
    const [scale, unit] = { B: [GIB, 'GiB'], 'B/s': [2 ** 20, 'MiB/s'] }[resp.unit] || [1, resp.unit];
    const scaled = (values) => (scale === 1 ? values : values.map((v) => (typeof v === 'number' ? v / scale : v)));
    const series = {};
    for (const [rank, s] of Object.entries(resp.series || {})) {
      series[rank] = { step: s.time.map((t) => Math.round(t * 1000)), value: scaled(s.value) };
    }
    let band = null;
    if (resp.band) {
      band = { step: resp.band.time.map((t) => Math.round(t * 1000)) };
      for (const k of ['median', 'p5', 'p95', 'min', 'max']) band[k] = scaled(resp.band[k]);
    }
    super.load({ ...resp, series, band, unit });
    this.title.textContent = unit ? `${resp.title} (${unit})` : resp.title;
  }

  xAxis() {
    const [lo, hi] = this.app.extent();
    return { type: 'time', min: Number.isFinite(lo) ? lo : null, max: Number.isFinite(hi) ? hi : null, splitLine: { show: false }, axisLabel: { hideOverlap: true } };
  }

  eventSeries() {
    return { id: 'events', type: 'line', data: [] };
  }

  rankSeries(rank) {
    const out = super.rankSeries(rank);
    const label = out[0].endLabel;
    if (label.show && this.labelledRanks().indexOf(rank) >= MAX_END_LABELS) out[0].endLabel = { ...label, show: false };
    return out;
  }

  // The drawn ranks whose style asks for an end label, in rank order.
  labelledRanks() {
    return this.drawnRanks().filter((r) => {
      const style = this.rankStyle(r);
      return style.endLabel ?? style.kind !== 'healthy';
    });
  }

  render() {
    const shown = super.render();
    const [, hi] = this.stepExtent();
    this.stepTag.textContent = Number.isFinite(hi) ? ` at ${clock(hi)}` : '';
    return shown;
  }

  // The nearest sample of each drawn rank to the pointer (ranks sample at their own times).
  tooltip(params) {
    if (!params.length) return '';
    const t = Number(params[0].axisValue);
    const rows = [];
    for (const rank of this.drawnRanks()) {
      const line = this.visibleLine(rank);
      let i = lowerBound(line.steps, t);
      if (i > 0 && (i === line.steps.length || t - line.steps[i - 1] < line.steps[i] - t)) i -= 1;
      if (i < line.steps.length) rows.push([rank, line.values[i]]);
    }
    rows.sort((a, b) => (b[1] ?? -Infinity) - (a[1] ?? -Infinity));
    const head = `<b>${esc(clock(t))}</b>`;
    const body = rows.slice(0, 12).map(([rank, v]) => `rank ${esc(rank)}: ${esc(fmt(v))}${this.unit ? ` ${esc(this.unit)}` : ''}`);
    if (rows.length > 12) body.push(`… ${rows.length - 12} more`);
    return [head, ...body].join('<br>');
  }
}

export function hardwareView({ state, toggleRank: toggle, roleStyle, redrawTable }) {
  const toggleRank = (rank) => {
    toggle(rank);
    restyle();
  };
  const $ = (id) => document.getElementById(id);
  const charts = new Map(); // metric -> HardwareChart
  let hw = null; // the last /api/run/telemetry answer (the cards now)
  let timer = null;
  let run = null;
  const hwState = {
    get selected() { return state.selected; },
    get log() { return false; },
    ema: 0,
    zoom: null,
    divergent: new Map(), // metric -> Set of flagged ranks
  };
  const hwApp = {
    state: hwState,
    highlighted: () => flaggedRanks(hwState.divergent),
    extent: () => spanOf(charts),
    rankRole: () => null,
    roleStyle,
    stepEvents: () => [],
    toggleRank,
    onZoom() {},
  };

  function section() { return $('hardware'); }

  function renderFindings() {
    const box = $('hw-findings');
    const findings = hw ? hw.findings : [];
    const rows = findings.slice(0, MAX_FINDINGS).map((f) => {
      const line = el('div', { class: `hw-finding rule-${f.rule}` });
      line.append(el('span', { class: 'hw-rule' }, ruleWord(f.rule)), ' ', el('span', {}, f.message));
      return line;
    });
    if (findings.length > MAX_FINDINGS) rows.push(el('div', { class: 'hw-more' }, `and ${findings.length - MAX_FINDINGS} more`));
    if (!findings.length && hw && Object.keys(hw.ranks).length) rows.push(el('div', { class: 'hw-ok' }, 'every card is in line with its peers'));
    box.replaceChildren(...rows);
  }

  // One tile per node: its cards in rank order, a flagged card red; a node fault marks the tile.
  function renderNodes() {
    const box = $('hw-nodes');
    if (!hw) return box.replaceChildren();
    const nodeFault = new Map();
    for (const f of hw.findings) if (f.rule === 'hw_node') nodeFault.set(f.host, f);
    const tiles = [];
    for (const [host, ranks] of Object.entries(hw.nodes)) {
      const fault = nodeFault.get(host);
      const tile = el('div', { class: fault ? 'hw-node faulty' : 'hw-node', title: fault ? fault.message : '' });
      tile.dataset.host = host;
      tile.append(el('div', { class: 'hw-host' }, host || 'unknown host'));
      const cells = el('div', { class: 'hw-cells' });
      for (const rank of ranks) {
        const row = hw.ranks[rank] || {};
        const flagged = (row.flags || []).length > 0;
        const cell = el('button', { type: 'button', class: `hw-card${flagged ? ' flagged' : ''}${state.selected.has(rank) ? ' selected' : ''}`, title: `rank ${rank} ${row.device || ''} ${TABLE_COLUMNS.map((c) => c.show(row)).filter(Boolean).join(', ')}` }, String(rank));
        cell.addEventListener('click', () => toggleRank(rank));
        cells.append(cell);
      }
      tile.append(cells);
      if (fault) tile.append(el('div', { class: 'hw-node-fault' }, fault.message.split(';')[0]));
      tiles.push(tile);
    }
    box.replaceChildren(...tiles);
  }

  // The rank table's hardware columns, after panels.js drew its rows.
  function decorateTable(thead, tbody) {
    if (!hw || !Object.keys(hw.ranks).length) return;
    const head = thead.querySelector('tr');
    if (head && !head.querySelector('.hw-col')) {
      for (const c of TABLE_COLUMNS) head.append(el('th', { scope: 'col', class: 'hw-col' }, c.label));
    }
    for (const tr of tbody.querySelectorAll('tr')) {
      if (tr.querySelector('.hw-col')) continue;
      const row = hw.ranks[tr.dataset.rank] || {};
      const flags = row.flags || [];
      for (const c of TABLE_COLUMNS) {
        const td = el('td', { class: 'hw-col' }, c.show(row));
        const mark = { temp: 'temp_c', util: '_pct', mem: 'used_bytes' }[c.key];
        if (flags.some((f) => f.endsWith(mark))) td.classList.add('zbad');
        tr.append(td);
      }
    }
  }

  async function loadCards() {
    const got = await api('/api/run/telemetry', { run });
    if (got.run !== run) return;
    hw = got;
    hwState.divergent = new Map(Object.entries(hw.outliers).map(([m, ranks]) => [m, new Set(ranks)]));
    section().hidden = !hw.metrics.length;
    const wanted = hw.metrics.filter((m) => m.chart);
    for (const [name, chart] of charts) {
      if (!wanted.some((m) => m.name === name)) {
        chart.dispose();
        charts.delete(name);
      }
    }
    for (const entry of wanted) {
      if (!charts.has(entry.name)) charts.set(entry.name, new HardwareChart(entry, $('hw-charts'), hwApp));
    }
    const n = Object.keys(hw.ranks).length;
    $('hw-info').textContent = n ? `${n} cards on ${Object.keys(hw.nodes).length} node(s), sampled every ${hw.interval_s} s` : '';
    renderFindings();
    renderNodes();
    redrawTable();
  }

  async function loadSeries() {
    await Promise.all([...charts.values()].map(async (chart) => {
      const resp = await api('/api/run/telemetry', { run, metric: chart.metric, view: state.view || 'auto', ranks: [...state.selected].join(',') });
      if (resp.run === run) chart.load(resp);
    }));
    for (const chart of charts.values()) chart.render();
  }

  async function reload() {
    if (!run) return;
    try {
      await loadCards();
      await loadSeries();
      window.rankwatch.hardware.ready = true;
    } catch (err) {
      if (!String(err.message).startsWith('404')) console.warn('hardware:', err);
    }
  }

  function selectRun(name) {
    clearInterval(timer);
    for (const chart of charts.values()) chart.dispose();
    charts.clear();
    hw = null;
    run = name;
    window.rankwatch.hardware.ready = false;
    section().hidden = true;
    if (!name) return Promise.resolve();
    timer = setInterval(reload, RELOAD_MS);
    return reload();
  }

  // A live telemetry message: the cards' latest values (the table, the node tiles).
  function onMessage(msg) {
    if (!hw || msg.run !== run) return;
    for (const [rank, row] of Object.entries(msg.ranks || {})) hw.ranks[rank] = { ...(hw.ranks[rank] || {}), ...row };
    renderNodes();
    redrawTable();
  }

  function restyle() {
    for (const chart of charts.values()) {
      chart.needsFull = true;
      chart.render();
    }
    renderNodes();
  }

  window.rankwatch.hardware = { charts, ready: false, get cards() { return hw; } };
  return { selectRun, onMessage, decorateTable, restyle, reload };
}
