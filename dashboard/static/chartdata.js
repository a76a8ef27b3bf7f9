// The data behind a chart, free of ECharts and the DOM: per-rank lines and band columns, how
// fresh points go in, how a zoomed window is spliced in, smoothing, and the scans the chart's
// labels come from (first non-finite value, ranks that ended non-finite, a constant series).

import { lowerBound, num } from './util.js';

export function emptyLines() {
  return new Map(); // rank -> {steps: number[], values: number[]}
}

export function emptyBand() {
  return { steps: [], median: [], p5: [], p95: [], min: [], max: [] };
}

export function insertPoint(line, step, value) {
  const n = line.steps.length;
  if (!n || step > line.steps[n - 1]) {
    line.steps.push(step);
    line.values.push(value);
    return;
  }
  const i = lowerBound(line.steps, step);
  if (line.steps[i] === step) line.values[i] = value; // a resend: newer wins
  else {
    line.steps.splice(i, 0, step);
    line.values.splice(i, 0, value);
  }
}

export function linesFrom(series) {
  const lines = emptyLines();
  for (const [rank, data] of Object.entries(series || {})) {
    // Array.from: plain arrays (live points are spliced in) from JSON lists or binary columns
    lines.set(Number(rank), { steps: Array.from(data.step), values: Array.from(data.value, num) });
  }
  return lines;
}

export function bandFrom(band) {
  if (!band || !band.step) return emptyBand();
  const pick = (k) => Array.from(band[k] || [], num);
  return { steps: Array.from(band.step), median: pick('median'), p5: pick('p5'), p95: pick('p95'), min: pick('min'), max: pick('max') };
}

// The store lags the live stream by a flush or so: points already drawn past what a fresh read
// returned are kept, not dropped (for every rank in rank mode; in band mode, drawn ranks only).
export function keepNewer(fresh, old, allRanks) {
  const tail = (steps, after) => lowerBound(steps, after + 1);
  for (const [rank, line] of old.lines) {
    const got = fresh.lines.get(rank);
    if (!got && !allRanks) continue;
    const into = got || { steps: [], values: [] };
    const last = into.steps.length ? into.steps[into.steps.length - 1] : -Infinity;
    const i = tail(line.steps, last);
    if (i >= line.steps.length) continue;
    fresh.lines.set(rank, {
      steps: into.steps.concat(line.steps.slice(i)),
      values: into.values.concat(line.values.slice(i)),
    });
  }
  const band = fresh.band;
  const last = band.steps.length ? band.steps[band.steps.length - 1] : -Infinity;
  const i = tail(old.band.steps, last);
  for (const key of Object.keys(band)) band[key] = band[key].concat(old.band[key].slice(i));
}

// Base outside [start, end], detail inside: a zoomed window at finer resolution.
export function spliced(base, detail, start, end) {
  if (!detail) return base;
  const a = lowerBound(base.steps, start);
  const b = lowerBound(base.steps, end + 1);
  const out = {};
  for (const key of Object.keys(base)) {
    out[key] = base[key].slice(0, a).concat(detail[key] || [], base[key].slice(b));
  }
  return out;
}

// Exponential moving average, debiased like TensorBoard's so the start is not pulled to 0.
export function ema(values, weight) {
  const out = new Array(values.length);
  let last = 0;
  let n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || !Number.isFinite(v)) {
      out[i] = v;
      continue;
    }
    n += 1;
    last = last * weight + (1 - weight) * v;
    out[i] = last / (1 - weight ** n);
  }
  return out;
}

export function fmtConstant(v) {
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e4 || a < 1e-2) ? v.toExponential(1) : String(Number(v.toPrecision(4)));
}

// The first non-finite value among `lines` (rank -> line): {rank, step, value}, or null.
export function firstNonFinite(lines) {
  let best = null;
  for (const [rank, line] of lines) {
    for (let i = 0; i < line.steps.length; i++) {
      const v = line.values[i];
      if (v === null || Number.isFinite(v)) continue;
      const step = line.steps[i];
      if (!best || step < best.step || (step === best.step && rank < best.rank)) best = { rank, step, value: v };
      break;
    }
  }
  return best;
}

// Ranks whose last value is non-finite, `first` (the rank that went first) first, then by rank.
export function endedNonFinite(lines, first) {
  const out = [];
  for (const [rank, line] of lines) {
    const v = line.values[line.values.length - 1];
    if (line.values.length && v !== null && !Number.isFinite(v)) out.push(rank);
  }
  return out.sort((a, b) => (b === first) - (a === first) || a - b);
}

// The one value every series in `columns` (arrays of values) holds, or null if any differs.
export function constantValue(columns) {
  let value = null;
  for (const values of columns) {
    for (const v of values) {
      if (v === null) continue;
      if (!Number.isFinite(v)) return null;
      if (value === null) value = v;
      else if (v !== value) return null;
    }
  }
  return value;
}
