// One ECharts line chart per metric, every rank overlaid (or, past 32 ranks, a median with
// min–max and p5–p95 bands plus the outlier and selected ranks drawn one by one).
//
// Data per chart: `base` covers the whole run at screen resolution; `detail` covers the zoom
// window at finer resolution once the user zoomed. What is drawn is base outside the window
// and detail inside it, so the slider still shows the whole run. Live points are appended to
// both; the app redraws at most a few times a second with only the changed series.

import {
  bandFrom, constantValue, emptyBand, emptyLines, endedNonFinite, firstNonFinite, fmtConstant,
  insertPoint, keepNewer, linesFrom, spliced, ema,
} from './chartdata.js';
import { REF_STYLE, clipToSteps } from './refrun.js';
import { tooltipHtml } from './tooltip.js';
import { fmt, lowerBound, median, num } from './util.js';

export { ema }; // the page's tests and tools import it from here

const HEALTHY = { color: '#9aa5b1', width: 1, opacity: 0.75 };
const DIVERGENT_COLORS = ['#d62728', '#ff7f0e', '#e377c2', '#8c564b', '#bcbd22', '#f59e0b'];
const SELECTED_COLORS = ['#1f77b4', '#17becf', '#2ca02c', '#9467bd', '#0ea5e9', '#059669'];
const MARKER_COLOR = '#7c3aed';
const MAX_MARKERS = 20; // NaN/Inf markers per series: the first of each run of bad values
// End labels of ranks that ended non-finite: such lines stop at one step, side by side, and
// a second label already covers the first. Past this many, a count in the chart's title line.
const MAX_NAN_LABELS = 1;
const MIN_BAND_RANKS = 8; // below this a p5–p95 band is two of the ranks, not percentiles
const REF_LABEL_MIN_WIDTH = 480; // px of chart below which the reference line has no end label
const LOG_PAD = 0.05; // a log axis fits the data: this share of its span as room below and above
// The end labels' line height, in px, and their shifting apart where they meet. ECharts takes a
// label's height from the width of a CJK glyph; where the browser has no CJK font that glyph
// is a few px wide, so labels of lines that end together were moved apart by too little and
// drawn over each other ("median" over "rank 37" on an lr chart every rank shares).
const END_LABEL_LAYOUT = { lineHeight: 14 };
const END_LABEL_SHIFT = { moveOverlap: 'shiftY' };
const EVENT_STYLE = {
  crash: { color: '#dc2626', type: 'solid' },
  end: { color: '#6b7280', type: 'dashed' },
  restart: { color: '#ea580c', type: 'dashed' },
};

export class MetricChart {
  constructor(metric, container, app) {
    this.metric = metric;
    this.app = app;
    this.mode = 'ranks';
    this.ranksTotal = 0;
    this.outliers = new Set();
    this.base = { lines: emptyLines(), band: emptyBand() };
    this.detail = null; // {start, end, lines, band}
    this.dirty = new Set(); // series ids with new data since the last draw
    this.needsFull = true;
    this.pendingSteps = new Set(); // steps appended live, not yet drawn (freshness hook)
    this.unit = '';
    this.nonnegative = false;
    this.firstBad = null; // {rank, step}: the first non-finite value of any drawn rank
    this.constant = null; // the one value of a series that never changed, or null
    this.ref = null; // {run, line, text, missing}: the reference run's median (refrun.js)

    this.card = document.createElement('section');
    this.card.className = 'card chart-card';
    const head = document.createElement('h2');
    this.title = document.createElement('span');
    this.title.textContent = metric;
    this.info = document.createElement('span');
    this.info.className = 'chart-info';
    this.stepTag = document.createElement('span');
    this.stepTag.className = 'chart-info step-tag';
    head.append(this.title, ' ', this.info, this.stepTag);
    this.el = document.createElement('div');
    this.el.className = 'chart';
    // A series that never changed (lr on a flat schedule) is one line of text, not a panel:
    // the chart comes back the moment a value differs.
    this.constEl = document.createElement('p');
    this.constEl.className = 'chart-constant';
    this.constEl.hidden = true;
    this.refEl = document.createElement('p');
    this.refEl.className = 'chart-ref';
    this.refEl.hidden = true;
    this.card.append(head, this.refEl, this.constEl, this.el);
    container.append(this.card);
    this.chart = echarts.init(this.el, null, { renderer: 'canvas' });
    this.chart.on('datazoom', (e) => {
      const b = e.batch ? e.batch[0] : e;
      if (b.start !== undefined) app.onZoom(b.start, b.end, this);
    });
    this.chart.on('click', (p) => {
      const id = String(p.seriesId || '');
      if (id.startsWith('r:')) app.toggleRank(Number(id.slice(2)));
    });
  }

  dispose() {
    this.chart.dispose();
    this.card.remove();
  }

  load(resp, window) {
    this.mode = resp.mode;
    this.ranksTotal = resp.ranks_total;
    this.outliers = new Set(resp.outliers);
    if (typeof resp.unit === 'string' && resp.unit !== this.unit) {
      this.unit = resp.unit;
      this.title.textContent = this.unit ? `${this.metric} (${this.unit})` : this.metric;
    }
    this.nonnegative = resp.nonnegative === true;
    const data = { lines: linesFrom(resp.series), band: bandFrom(resp.band) };
    if (window) this.detail = { start: window.start, end: window.end, ...data };
    else {
      keepNewer(data, this.base, this.mode === 'ranks');
      this.base = data;
      this.detail = null;
    }
    this.needsFull = true;
  }

  // The reference run's line and comparison (refrun.js), or null for none.
  setRef(ref) {
    const before = this.ref;
    this.ref = ref;
    this.refEl.hidden = !ref;
    this.refEl.classList.toggle('missing', !!(ref && ref.missing));
    if (ref) {
      const swatch = document.createElement('span');
      swatch.className = 'ref-swatch';
      this.refEl.replaceChildren(swatch, ref.text);
      this.refEl.title = ref.text;
    }
    if ((before && before.line) !== (ref && ref.line) || !before !== !ref) this.needsFull = true;
    // An open tooltip over a series that goes away throws inside ECharts: close it first.
    if (before && before.line && !(ref && ref.line)) this.chart.dispatchAction({ type: 'hideTip' });
  }

  refSeries() {
    const [lo, hi] = this.app.extent();
    const line = clipToSteps(this.ref && this.ref.line, lo, hi);
    const shown = this.app.state.ema > 0 ? ema(line.values, this.app.state.ema) : line.values;
    return {
      id: 'ref',
      name: `ref: ${this.ref ? this.ref.run : ''}`,
      type: 'line',
      data: line.steps.map((s, i) => [s, this.yValue(shown[i])]),
      showSymbol: false,
      silent: true,
      z: 4,
      color: REF_STYLE.color,
      lineStyle: { ...REF_STYLE },
      // On a narrow chart the end labels of flagged ranks already crowd the right edge; the
      // line under the title names the reference there.
      endLabel: { show: (this.el.clientWidth || 800) >= REF_LABEL_MIN_WIDTH, formatter: () => 'ref', color: REF_STYLE.color, fontStyle: 'italic', ...END_LABEL_LAYOUT },
      labelLayout: END_LABEL_SHIFT,
    };
  }

  // This run's step span changed with no new points to draw: the axis and the reference's
  // clip follow.
  onExtent() {
    const opt = { xAxis: this.xAxis() };
    if (this.ref && this.ref.line) opt.series = [{ id: 'ref', data: this.refSeries().data }];
    this.chart.setOption(opt);
  }

  dropDetail() {
    if (this.detail) this.needsFull = true;
    this.detail = null;
  }

  pointCount() {
    let n = 0;
    for (const line of this.base.lines.values()) n = Math.max(n, line.steps.length);
    return Math.max(n, this.base.band.steps.length);
  }

  stepExtent() {
    let lo = Infinity;
    let hi = -Infinity;
    const see = (steps) => {
      if (steps.length) {
        lo = Math.min(lo, steps[0]);
        hi = Math.max(hi, steps[steps.length - 1]);
      }
    };
    for (const line of this.base.lines.values()) see(line.steps);
    see(this.base.band.steps);
    return [lo, hi];
  }

  // Live points of one feed message: [[rank, step, value], ...] for this metric.
  append(points) {
    const byStep = new Map();
    for (const [rank, step, raw] of points) {
      const value = num(raw);
      if (!byStep.has(step)) byStep.set(step, []);
      byStep.get(step).push(value);
      const drawn = this.mode === 'ranks' || this.base.lines.has(rank);
      if (!drawn) continue;
      for (const target of [this.base, this.detail]) {
        if (!target) continue;
        if (target !== this.base && (step < target.start || step > target.end)) continue;
        if (!target.lines.has(rank)) {
          target.lines.set(rank, { steps: [], values: [] });
          this.needsFull = true; // a new series: structure changed
        }
        insertPoint(target.lines.get(rank), step, value);
      }
      this.dirty.add(`r:${rank}`);
      this.pendingSteps.add(step);
    }
    if (this.mode !== 'band') return;
    for (const [step, values] of byStep) {
      const finite = values.filter(Number.isFinite).sort((a, b) => a - b);
      if (!finite.length) continue;
      const q = (p) => finite[Math.min(finite.length - 1, Math.floor(p * finite.length))];
      const col = { median: median(finite), p5: q(0.05), p95: q(0.95), min: finite[0], max: finite[finite.length - 1] };
      for (const band of [this.base.band, this.detail && this.detail.band]) {
        if (!band) continue;
        const i = lowerBound(band.steps, step);
        if (band.steps[i] !== step) {
          band.steps.splice(i, 0, step);
          for (const k of Object.keys(col)) band[k].splice(i, 0, col[k]);
        } else for (const k of Object.keys(col)) band[k][i] = col[k];
      }
      this.pendingSteps.add(step);
    }
    this.dirty.add('band');
  }

  visibleLine(rank) {
    const base = this.base.lines.get(rank) || { steps: [], values: [] };
    const det = this.detail && this.detail.lines.get(rank);
    return det ? spliced(base, det, this.detail.start, this.detail.end) : base;
  }

  visibleBand() {
    return this.detail ? spliced(this.base.band, this.detail.band, this.detail.start, this.detail.end) : this.base.band;
  }

  // Which ranks get a line: every rank in rank mode; outliers, divergent and selected in band mode.
  drawnRanks() {
    return [...this.base.lines.keys()].sort((a, b) => a - b);
  }

  rankStyle(rank) {
    const st = this.app.state;
    const byRole = this.app.roleStyle && this.app.roleStyle(rank); // incidents.js: culprit, affected
    if (byRole) return byRole;
    const divergent = (st.divergent.get(this.metric) || new Set()).has(rank) || this.outliers.has(rank);
    if (divergent) {
      const order = [...this.app.highlighted()].sort((a, b) => a - b);
      const color = DIVERGENT_COLORS[Math.max(0, order.indexOf(rank)) % DIVERGENT_COLORS.length];
      return { kind: 'divergent', color, width: 2.6, opacity: 1, z: 6 };
    }
    if (st.selected.has(rank)) {
      const order = [...st.selected].sort((a, b) => a - b);
      return { kind: 'selected', color: SELECTED_COLORS[order.indexOf(rank) % SELECTED_COLORS.length], width: 2, opacity: 1, z: 5 };
    }
    return { kind: 'healthy', ...HEALTHY, z: 2 };
  }

  yValue(v) {
    if (v === null || !Number.isFinite(v)) return null;
    if (this.app.state.log && v <= 0) return null; // no place for it on a log axis
    return v;
  }

  // The first non-finite value among the drawn ranks: the rank that went first. Markers go on
  // its line only; the other ranks' non-finite steps would pile up at the same step.
  drawnLines() {
    return this.drawnRanks().map((rank) => [rank, this.visibleLine(rank)]);
  }

  findFirstBad() {
    return firstNonFinite(this.drawnLines());
  }

  endedBad() {
    return endedNonFinite(this.drawnLines(), this.firstBad && this.firstBad.rank);
  }

  findConstant() {
    const columns = this.drawnLines().map(([, line]) => line.values);
    if (this.mode === 'band') columns.push(this.visibleBand().median);
    return constantValue(columns);
  }

  markers(line, rank) {
    const data = [];
    const first = this.firstBad;
    if (!first || first.rank !== rank) return { data };
    let lastFinite = null;
    for (let i = 0; i < line.steps.length && data.length < MAX_MARKERS; i++) {
      const v = line.values[i];
      if (v !== null && Number.isFinite(v)) {
        lastFinite = v;
        continue;
      }
      if (v === null || (i > 0 && !Number.isFinite(line.values[i - 1]) && line.values[i - 1] !== null)) continue;
      let y = lastFinite;
      for (let j = i + 1; y === null && j < line.values.length; j++) if (Number.isFinite(line.values[j])) y = line.values[j];
      if (y === null || (this.app.state.log && y <= 0)) y = this.app.state.log ? 1 : 0;
      const label = Number.isNaN(v) ? 'NaN' : v > 0 ? '+Inf' : '-Inf';
      const item = { name: label, value: label, coord: [line.steps[i], y] };
      if (line.steps[i] === first.step) {
        Object.assign(item, {
          symbol: 'pin',
          symbolSize: 46,
          label: { show: true, position: 'top', color: MARKER_COLOR, fontWeight: 'bold', fontSize: 11, formatter: `first ${label}: rank ${rank}` },
        });
      }
      data.push(item);
    }
    return {
      symbol: 'pin',
      symbolSize: 38,
      silent: true,
      itemStyle: { color: MARKER_COLOR },
      label: { color: '#fff', fontSize: 10, formatter: (p) => p.name },
      data,
    };
  }

  rankSeries(rank) {
    const st = this.app.state;
    const style = this.rankStyle(rank);
    const line = this.visibleLine(rank);
    const shown = st.ema > 0 ? ema(line.values, st.ema) : line.values;
    const data = line.steps.map((s, i) => [s, this.yValue(shown[i])]);
    const bad = this.endedBad();
    const hideLabel = bad.indexOf(rank) >= MAX_NAN_LABELS;
    const out = [{
      id: `r:${rank}`,
      name: `rank ${rank}`,
      type: 'line',
      data,
      showSymbol: false,
      triggerLineEvent: true,
      connectNulls: false,
      z: style.z,
      color: style.color,
      lineStyle: { width: style.width, color: style.color, opacity: style.opacity, type: style.type || 'solid' },
      emphasis: { focus: 'none', lineStyle: { width: style.width + 1 } },
      endLabel: {
        show: (style.endLabel ?? style.kind !== 'healthy') && !hideLabel,
        formatter: () => `rank ${rank}`,
        color: style.color,
        fontWeight: 'bold',
        distance: 4,
        ...END_LABEL_LAYOUT,
      },
      labelLayout: END_LABEL_SHIFT,
      markPoint: this.markers(line, rank),
    }];
    if (st.ema > 0) {
      out.push({
        id: `raw:${rank}`,
        name: `rank ${rank} (raw)`,
        type: 'line',
        data: line.steps.map((s, i) => [s, this.yValue(line.values[i])]),
        showSymbol: false,
        silent: true,
        z: 1,
        lineStyle: { width: 1, color: style.color, opacity: 0.22 },
        tooltip: { show: false },
      });
    }
    return out;
  }

  bandSeries() {
    const band = this.visibleBand();
    const pair = (lo, hi) => band.steps.map((s, i) => {
      const a = this.yValue(band[lo][i]);
      const b = this.yValue(band[hi][i]);
      return a === null || b === null ? [s, null, null] : [s, a, b - a];
    });
    const stacked = (id, name, lo, hi, color) => [
      { id: `${id}:lo`, name, type: 'line', stack: id, data: pair(lo, hi).map(([s, a]) => [s, a]), showSymbol: false, silent: true, lineStyle: { opacity: 0 }, z: 0, tooltip: { show: false } },
      { id: `${id}:hi`, name, type: 'line', stack: id, data: pair(lo, hi).map(([s, , d]) => [s, d]), showSymbol: false, silent: true, lineStyle: { opacity: 0 }, areaStyle: { color }, z: 0, tooltip: { show: false } },
    ];
    const percentiles = this.ranksTotal >= MIN_BAND_RANKS
      ? stacked('band:p', 'p5–p95', 'p5', 'p95', 'rgba(100, 116, 139, 0.28)')
      : [];
    return [
      ...stacked('band:mm', 'min–max', 'min', 'max', 'rgba(100, 116, 139, 0.13)'),
      ...percentiles,
      {
        id: 'band:median',
        name: 'median',
        type: 'line',
        data: band.steps.map((s, i) => [s, this.yValue(band.median[i])]),
        showSymbol: false,
        z: 3,
        lineStyle: { width: 1.6, color: '#475569' },
        color: '#475569',
        endLabel: { show: true, formatter: () => 'median', color: '#475569', ...END_LABEL_LAYOUT },
        labelLayout: END_LABEL_SHIFT,
      },
    ];
  }

  eventSeries() {
    const data = [];
    for (const ev of this.app.stepEvents()) {
      const style = EVENT_STYLE[ev.kind];
      if (!style) continue;
      data.push({ xAxis: ev.step, name: ev.label, lineStyle: { ...style, width: 1.2 }, label: { color: style.color } });
    }
    return {
      id: 'events',
      name: 'events',
      type: 'line',
      data: [],
      markLine: { symbol: 'none', silent: true, animation: false, label: { formatter: (p) => p.name, position: 'insideEndTop', fontSize: 10 }, data },
    };
  }

  allSeries() {
    const out = this.mode === 'band' ? this.bandSeries() : [];
    for (const rank of this.drawnRanks()) out.push(...this.rankSeries(rank));
    if (this.ref && this.ref.line) out.push(this.refSeries());
    out.push(this.eventSeries());
    return out;
  }

  zoomOption() {
    const z = this.app.state.zoom;
    const range = z ? { startValue: z.start, endValue: z.end } : { start: 0, end: 100 };
    return [
      { type: 'inside', xAxisIndex: 0, filterMode: 'none', ...range },
      { type: 'slider', xAxisIndex: 0, filterMode: 'none', height: 16, bottom: 6, showDetail: false, ...range },
    ];
  }

  xAxis() {
    const [lo, hi] = this.app.extent();
    return { type: 'value', min: Number.isFinite(lo) ? lo : null, max: Number.isFinite(hi) ? hi : null, minInterval: 1, name: 'step', nameGap: 4, splitLine: { show: false } };
  }

  yAxis() {
    const base = {
      scale: true,
      splitLine: { lineStyle: { color: '#eef0f3' } },
      name: this.unit,
      nameGap: 6,
      nameTextStyle: { align: 'left', color: '#6b7280' },
    };
    // A log axis rounds out to whole decades by default: most of the height is empty. Fit it.
    if (this.app.state.log) {
      const room = (e) => Math.max(e.max / e.min, 1.0001) ** LOG_PAD;
      return { ...base, type: 'log', min: (e) => e.min / room(e), max: (e) => e.max * room(e), axisLabel: { formatter: (v) => fmt(v), hideOverlap: true } };
    }
    // A little room above and below, so a line that sits on the extreme is not hidden by the axis;
    // never below 0 for a metric that cannot be negative.
    const axis = { ...base, type: 'value', boundaryGap: ['4%', '4%'] };
    // null: ECharts' own rounded minimum, which is only replaced where it would go below 0.
    if (this.nonnegative) axis.min = (e) => (e.min - 0.04 * (e.max - e.min) < 0 ? 0 : null);
    return axis;
  }

  fullOption() {
    return {
      animation: false,
      grid: { left: 58, right: 64, top: this.unit ? 26 : 16, bottom: 48 },
      tooltip: { trigger: 'axis', confine: true, formatter: (p) => this.tooltip(p), axisPointer: { type: 'line', snap: true }, transitionDuration: 0 },
      xAxis: this.xAxis(),
      yAxis: this.yAxis(),
      dataZoom: this.zoomOption(),
      series: this.allSeries(),
    };
  }

  // Draw what changed; returns the steps that became visible (for the freshness hook).
  render() {
    const firstBad = this.findFirstBad();
    const badKey = (b) => (b ? `${b.rank}@${b.step}` : '');
    if (badKey(firstBad) !== badKey(this.firstBad)) this.needsFull = true;
    this.firstBad = firstBad;
    const endedKey = this.endedBad().join(',');
    if (endedKey !== this.endedKey) this.needsFull = true; // end labels come and go
    this.endedKey = endedKey;
    const constant = this.findConstant();
    if (constant !== this.constant) {
      this.constant = constant;
      this.constEl.hidden = constant === null;
      this.constEl.textContent = constant === null ? '' : `${this.metric} ${fmtConstant(constant)}${this.unit ? ` ${this.unit}` : ''}, constant`;
      const wasHidden = this.el.hidden;
      this.el.hidden = constant !== null;
      this.card.classList.toggle('is-constant', constant !== null);
      if (wasHidden && !this.el.hidden) this.chart.resize();
      this.needsFull = true;
    }
    if (this.needsFull) {
      this.chart.setOption(this.fullOption(), { replaceMerge: ['series'], lazyUpdate: false });
      this.needsFull = false;
    } else if (this.dirty.size) {
      const series = [];
      for (const id of this.dirty) {
        if (id === 'band' && this.mode === 'band') series.push(...this.bandSeries().map((s) => ({ id: s.id, data: s.data })));
        else if (id.startsWith('r:')) {
          for (const s of this.rankSeries(Number(id.slice(2)))) series.push({ id: s.id, data: s.data, markPoint: s.markPoint });
        }
      }
      if (this.ref && this.ref.line) series.push({ id: 'ref', data: this.refSeries().data }); // the span may have grown
      const opt = { xAxis: this.xAxis(), series };
      if (this.app.state.zoom) opt.dataZoom = this.zoomOption();
      this.chart.setOption(opt, { lazyUpdate: false });
    }
    this.dirty.clear();
    const shown = [...this.pendingSteps];
    this.pendingSteps.clear();
    const drawn = this.drawnRanks().length;
    const parts = [];
    if (this.mode !== 'band') parts.push(`${drawn} ranks`);
    else if (this.ranksTotal >= MIN_BAND_RANKS) parts.push(`${this.ranksTotal.toLocaleString('en-US')} ranks: median, p5–p95, min–max`);
    else parts.push(`band: ${this.ranksTotal} ranks, p5–p95 not meaningful; median and min–max`);
    if (this.mode === 'band' && drawn) parts.push(`${drawn} drawn one by one`);
    const hidden = this.endedBad().length - MAX_NAN_LABELS;
    if (hidden > 0) parts.push(`+${hidden} ranks NaN`);
    this.info.textContent = parts.join('; ');
    const [, hi] = this.stepExtent();
    this.stepTag.textContent = Number.isFinite(hi) ? `at step ${hi}` : '';
    return shown;
  }

  tooltip(params) {
    return tooltipHtml(this, params);
  }
}
