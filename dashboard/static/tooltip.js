// The chart tooltip at a step: the drawn ranks sorted by value, each with its robust z against
// the others (or, in band mode, against the band). The one place the page writes HTML: every
// value goes through esc().

import { refAt } from './refrun.js';
import { esc, fmt, fmtZ, lowerBound, median } from './util.js';

const TOOLTIP_MAX_ROWS = 16;
const MAD_TO_SIGMA = 1.4826;
const P5_P95_TO_SIGMA = 3.29; // p95 - p5 of a normal distribution, in standard deviations

export function tooltipHtml(chart, params) {
  if (!params.length) return '';
  const step = Number(params[0].axisValue);
  const rows = [];
  for (const rank of chart.drawnRanks()) {
    const line = chart.visibleLine(rank);
    const i = lowerBound(line.steps, step);
    if (line.steps[i] === step) rows.push({ rank, v: line.values[i] });
  }
  let center = NaN;
  let scale = NaN;
  let bandText = '';
  const band = chart.visibleBand();
  const bi = lowerBound(band.steps, step);
  if (chart.mode === 'band' && band.steps[bi] === step) {
    center = band.median[bi];
    scale = (band.p95[bi] - band.p5[bi]) / P5_P95_TO_SIGMA;
    bandText = `median ${fmt(center)} · p5–p95 ${fmt(band.p5[bi])} – ${fmt(band.p95[bi])} · ${chart.ranksTotal} ranks`;
  } else {
    const finite = rows.map((r) => r.v).filter(Number.isFinite).sort((a, b) => a - b);
    center = median(finite);
    const mad = median(finite.map((v) => Math.abs(v - center)).sort((a, b) => a - b));
    scale = MAD_TO_SIGMA * mad;
  }
  scale = Math.max(scale, 1e-3 * Math.abs(center), 1e-12);
  rows.sort((a, b) => (Number.isFinite(b.v) ? b.v : Infinity) - (Number.isFinite(a.v) ? a.v : Infinity));
  const lines = [`<div class="tt-head">${esc(chart.metric)} · step ${esc(step)}</div>`];
  if (bandText) lines.push(`<div class="tt-band">${esc(bandText)}</div>`);
  // Which z this is: the banner's is the z at first report, the table's the z now.
  const against = chart.mode === 'band' && bandText ? 'the band' : 'the drawn ranks';
  lines.push(`<div class="tt-band">z at step ${esc(step)}, against ${esc(against)}</div>`);
  let shownRows = rows;
  let skipped = 0;
  if (rows.length > TOOLTIP_MAX_ROWS) {
    const half = TOOLTIP_MAX_ROWS / 2;
    skipped = rows.length - TOOLTIP_MAX_ROWS;
    shownRows = [...rows.slice(0, half), null, ...rows.slice(-half)];
  }
  for (const row of shownRows) {
    if (row === null) {
      lines.push(`<div class="tt-more">… ${esc(skipped)} more</div>`);
      continue;
    }
    const style = chart.rankStyle(row.rank);
    const z = Number.isFinite(row.v) ? (row.v - center) / scale : row.v;
    const cls = style.kind === 'healthy' ? 'tt-row' : `tt-row tt-${style.kind}`;
    lines.push(
      `<div class="${cls}"><span class="tt-swatch" style="background:${esc(style.color)}"></span>` +
      `<span class="tt-rank">rank ${esc(row.rank)}</span><span class="tt-val">${esc(fmt(row.v))}</span>` +
      `<span class="tt-z">z ${esc(fmtZ(z))}</span></div>`,
    );
  }
  lines.push(refRow(chart, step));
  return lines.join('');
}

// The reference run's median at this step (or the last step it has before it), or why not.
function refRow(chart, step) {
  const ref = chart.ref;
  if (!ref || (!ref.line && !ref.missing)) return ''; // none, or not read yet
  const at = refAt(ref.line, step);
  const text = ref.missing ? `ref has no ${chart.metric} data`
    : at ? `ref at step ${at.step}: ${fmt(at.value)}` : `ref has no step ≤ ${step}`;
  return `<div class="tt-ref"><span class="tt-ref-swatch"></span>${esc(text)}</div>`;
}
