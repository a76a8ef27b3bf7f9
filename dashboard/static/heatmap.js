// Rank × step heatmap (GET /api/runs/{run}/heatmap). A cell is fault red only where the
// detector had that rank flagged (the API's `flagged`, from the detector's own confirmation
// state); elsewhere a light grey scale of |z| says how far the rank sat from the others without
// calling it a fault: a one-step jump of z 6 on a healthy run is a grey cell, never a red one.

import { esc, fmtZ, num } from './util.js';

const Z_CLIP = 8; // grey scale limit; beyond it every unflagged cell is the darkest grey
const FLAGGED_CELL = 50; // where a flagged cell sits on the colour scale (the fault colour)
const NONFINITE_CELL = 99; // where a NaN/Inf cell sits on the colour scale (its own colour)
const ROW_PX = 4; // height per rank, up to MAX_HEIGHT_PX
const LABEL_PX = 13;
const STEP_LABEL_PX = 44; // room one step label needs on the x axis
const GRID_LEFT_PX = 64;
const GRID_RIGHT_PX = 150;
const NARROW_PX = 600; // below this width the colour legend sits under the cells
const NARROW_LEGEND_PX = 86; // the legend's six rows under the cells
const MIN_HEIGHT_PX = 170;
const MAX_HEIGHT_PX = 1150; // 1,024 ranks still get a pixel row each

// metric -> Map(rank -> {z, step}): each rank's largest |z| in the last heatmap read ("peak z")
export const peaks = new Map();

export const HEAT_PIECES = [
  { gt: NONFINITE_CELL - 1, label: 'NaN / Inf', color: '#7c3aed' },
  { gte: FLAGGED_CELL - 1, lte: FLAGGED_CELL + 1, label: 'flagged by the detector', color: '#b2182b' },
  { gte: 6, lte: Z_CLIP, label: '|z| ≥ 6, not flagged', color: '#94a3b8' },
  { gte: 3, lt: 6, label: '|z| 3 … 6', color: '#cbd5e1' },
  { gte: 1.5, lt: 3, label: '|z| 1.5 … 3', color: '#e2e8f0' },
  { gte: 0, lt: 1.5, label: '|z| < 1.5', color: '#f8fafc' },
];

export class Heatmap {
  constructor(container, app) {
    this.app = app;
    this.el = container;
    this.chart = echarts.init(container, null, { renderer: 'canvas' });
    this.ranks = [];
    this.steps = [];
    this.lastStep = null;
    const head = container.closest('.card')?.querySelector('h2');
    this.stepTag = document.createElement('span');
    this.stepTag.className = 'chart-info step-tag';
    this.stepTag.id = 'heat-step';
    if (head) head.append(this.stepTag);
    this.chart.on('click', (p) => {
      if (p.componentType === 'series' && Array.isArray(p.value)) app.toggleRank(this.ranks[p.value[1]]);
    });
  }

  load(resp) {
    this.ranks = resp.ranks;
    this.steps = resp.steps;
    this.width = resp.width;
    this.metric = resp.metric;
    this.lastStep = resp.last_step ?? null;
    this.stepTag.textContent = this.lastStep === null ? '' : `at step ${this.lastStep}`;
    const flagged = resp.flagged || [];
    const peak = new Map();
    const data = [];
    resp.z.forEach((row, y) => {
      const flags = flagged[y] || [];
      row.forEach((raw, x) => {
        const z = num(raw);
        if (z === null) return;
        let cell = NONFINITE_CELL;
        if (Number.isFinite(z)) {
          cell = flags[x] ? FLAGGED_CELL : Math.min(Z_CLIP, Math.abs(z));
          const best = peak.get(this.ranks[y]);
          if (!best || Math.abs(z) > Math.abs(best.z)) peak.set(this.ranks[y], { z, step: this.steps[x] });
        }
        data.push([x, y, cell, z, flags[x] ? 1 : 0]);
      });
    });
    peaks.set(this.metric, peak);
    const legendPx = (this.el.clientWidth || 800) < NARROW_PX ? NARROW_LEGEND_PX : 0;
    const height = Math.min(MAX_HEIGHT_PX, Math.max(MIN_HEIGHT_PX, this.ranks.length * ROW_PX + 70)) + legendPx;
    if (this.el.style.height !== `${height}px`) {
      this.el.style.height = `${height}px`;
      this.chart.resize();
    }
    // On a narrow screen the legend goes under the cells, or it takes half their width.
    const narrow = (this.el.clientWidth || 800) < NARROW_PX;
    const right = narrow ? 12 : GRID_RIGHT_PX;
    const plotWidth = Math.max(60, (this.el.clientWidth || 800) - GRID_LEFT_PX - right);
    const legendAt = narrow
      ? { orient: 'vertical', left: 8, bottom: 0, itemGap: 3 }
      : { orient: 'vertical', right: 4, top: 'middle' };
    this.chart.setOption({
      animation: false,
      grid: { left: GRID_LEFT_PX, right, top: 8, bottom: 36 + legendPx },
      tooltip: {
        confine: true,
        formatter: (p) => {
          const [x, y, , z, flag] = p.value;
          const lo = this.steps[x];
          const hi = lo + this.width - 1;
          const span = hi > lo ? `steps ${lo}–${hi}` : `step ${lo}`;
          const verdict = flag ? 'flagged by the detector' : 'not flagged';
          const best = peak.get(this.ranks[y]);
          const peakText = best ? `<br>peak z ${esc(fmtZ(best.z))} at step ${esc(best.step)}` : '';
          return `<b>rank ${esc(this.ranks[y])}</b> · ${esc(this.metric)}<br>${esc(span)} · z at this step ${esc(fmtZ(z))}`
            + `<br>${esc(verdict)}${peakText}`;
        },
      },
      xAxis: {
        type: 'category',
        data: this.steps.map(String),
        name: 'step',
        nameGap: 4,
        splitArea: { show: false },
        // one label per STEP_LABEL_PX at most: 120 columns of step numbers are a smudge
        axisLabel: { interval: Math.max(0, Math.ceil((this.steps.length * STEP_LABEL_PX) / plotWidth) - 1), hideOverlap: true },
      },
      yAxis: {
        type: 'category',
        data: this.ranks.map(String),
        inverse: true,
        // one label per LABEL_PX of height at most, or a thousand ranks print as a smudge
        axisLabel: { fontSize: 10, interval: Math.max(0, Math.ceil((this.ranks.length * LABEL_PX) / (height - legendPx - 70)) - 1) },
        axisTick: { show: false },
      },
      visualMap: {
        type: 'piecewise',
        dimension: 2,
        ...legendAt,
        itemWidth: 12,
        itemHeight: 10,
        textStyle: { fontSize: 10 },
        pieces: HEAT_PIECES,
      },
      series: [{ id: 'z', type: 'heatmap', data, progressive: 0, emphasis: { itemStyle: { borderColor: '#111', borderWidth: 1 } } }],
    }, { replaceMerge: ['series'] });
  }

  clear() {
    this.chart.clear();
    this.ranks = [];
    this.steps = [];
    this.lastStep = null;
    this.stepTag.textContent = '';
  }
}
