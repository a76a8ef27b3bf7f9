// Rank × step heatmap of the robust z-score (GET /api/runs/{run}/heatmap): one bad card among
// a thousand shows as one red row.

import { esc, fmtZ, num } from './util.js';

const Z_CLIP = 8; // colour scale limit; beyond it every cell is "far off"
const NONFINITE_CELL = 99; // where a NaN/Inf cell sits on the colour scale (its own colour)
const ROW_PX = 4; // height per rank, up to MAX_HEIGHT_PX
const LABEL_PX = 13;
const MIN_HEIGHT_PX = 170;
const MAX_HEIGHT_PX = 1150; // 1,024 ranks still get a pixel row each

export class Heatmap {
  constructor(container, app) {
    this.app = app;
    this.el = container;
    this.chart = echarts.init(container, null, { renderer: 'canvas' });
    this.ranks = [];
    this.steps = [];
    this.chart.on('click', (p) => {
      if (p.componentType === 'series' && Array.isArray(p.value)) app.toggleRank(this.ranks[p.value[1]]);
    });
  }

  load(resp) {
    this.ranks = resp.ranks;
    this.steps = resp.steps;
    this.width = resp.width;
    this.metric = resp.metric;
    const data = [];
    resp.z.forEach((row, y) => {
      row.forEach((raw, x) => {
        const z = num(raw);
        if (z === null) return;
        data.push([x, y, Number.isFinite(z) ? Math.max(-Z_CLIP, Math.min(Z_CLIP, z)) : NONFINITE_CELL, z]);
      });
    });
    const height = Math.min(MAX_HEIGHT_PX, Math.max(MIN_HEIGHT_PX, this.ranks.length * ROW_PX + 70));
    if (this.el.style.height !== `${height}px`) {
      this.el.style.height = `${height}px`;
      this.chart.resize();
    }
    this.chart.setOption({
      animation: false,
      grid: { left: 64, right: 110, top: 8, bottom: 36 },
      tooltip: {
        confine: true,
        formatter: (p) => {
          const [x, y, , z] = p.value;
          const lo = this.steps[x];
          const hi = lo + this.width - 1;
          const span = hi > lo ? `steps ${lo}–${hi}` : `step ${lo}`;
          return `<b>rank ${esc(this.ranks[y])}</b> · ${esc(this.metric)}<br>${esc(span)} · z ${esc(fmtZ(z))}`;
        },
      },
      xAxis: { type: 'category', data: this.steps.map(String), name: 'step', nameGap: 4, splitArea: { show: false } },
      yAxis: {
        type: 'category',
        data: this.ranks.map(String),
        inverse: true,
        // one label per LABEL_PX of height at most, or a thousand ranks print as a smudge
        axisLabel: { fontSize: 10, interval: Math.max(0, Math.ceil((this.ranks.length * LABEL_PX) / (height - 70)) - 1) },
        axisTick: { show: false },
      },
      visualMap: {
        type: 'piecewise',
        dimension: 2,
        orient: 'vertical',
        right: 4,
        top: 'middle',
        itemWidth: 12,
        itemHeight: 10,
        textStyle: { fontSize: 10 },
        pieces: [
          { gt: Z_CLIP + 0.5, label: 'NaN / Inf', color: '#7c3aed' },
          { gte: 6, lte: Z_CLIP, label: 'z ≥ 6', color: '#b2182b' },
          { gte: 3, lt: 6, label: '3 … 6', color: '#ef8a62' },
          { gte: 1.5, lt: 3, label: '1.5 … 3', color: '#fddbc7' },
          { gt: -1.5, lt: 1.5, label: '|z| < 1.5', color: '#f7f7f7' },
          { gt: -3, lte: -1.5, label: '-3 … -1.5', color: '#d1e5f0' },
          { gt: -6, lte: -3, label: '-6 … -3', color: '#67a9cf' },
          { gte: -Z_CLIP, lte: -6, label: 'z ≤ -6', color: '#2166ac' },
        ],
      },
      series: [{ id: 'z', type: 'heatmap', data, progressive: 0, emphasis: { itemStyle: { borderColor: '#111', borderWidth: 1 } } }],
    }, { replaceMerge: ['series'] });
  }

  clear() {
    this.chart.clear();
    this.ranks = [];
    this.steps = [];
  }
}
