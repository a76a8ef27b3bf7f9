// The page's controls: run picker, log scale, smoothing, view, rank selection, table sorting,
// zoom reset, heatmap metric; and the URL hash, which a pasted link may change.
//
// ctx: {state, charts, app, heatmap(), selectRun, reloadAllSeries, scheduleRedraw, refetchZoom,
//       selectionChanged, loadHeatmap, renderPanels, showError, loadRef}

import { readUrl, writeUrl } from './urlstate.js';
import { checkRanks, debounce, formatRanks, parseRanks } from './util.js';

const $ = (id) => document.getElementById(id);

export function bindControls(ctx) {
  $('run').addEventListener('change', (e) => ctx.selectRun(e.target.value).catch(ctx.showError));
  $('log').addEventListener('change', (e) => {
    ctx.state.log = e.target.checked;
    for (const c of ctx.charts.values()) c.needsFull = true;
    writeUrl(ctx.state);
    ctx.scheduleRedraw();
  });
  const emaOut = $('ema-out');
  $('ema').addEventListener('input', (e) => {
    ctx.state.ema = Number(e.target.value);
    emaOut.textContent = ctx.state.ema ? ctx.state.ema.toFixed(2) : 'off';
    for (const c of ctx.charts.values()) c.needsFull = true;
    writeUrl(ctx.state);
    ctx.scheduleRedraw();
  });
  $('view').addEventListener('change', (e) => {
    ctx.state.view = e.target.value;
    writeUrl(ctx.state);
    ctx.reloadAllSeries().catch(ctx.showError);
  });
  const selectError = document.createElement('span');
  selectError.id = 'select-error';
  selectError.className = 'select-error';
  selectError.setAttribute('role', 'alert');
  selectError.hidden = true;
  $('select-input').after(selectError);
  $('select-input').addEventListener('change', (e) => {
    // a paged table holds one page of ranks: any rank may be typed then
    const known = ctx.state.big ? null : new Set(ctx.state.ranks.map((r) => r.rank));
    const { ranks, errors } = checkRanks(e.target.value, known);
    selectError.hidden = !errors.length;
    selectError.textContent = errors.length ? `not selected: ${errors.join('; ')}` : '';
    e.target.setAttribute('aria-invalid', errors.length ? 'true' : 'false');
    ctx.state.selected = ranks;
    ctx.selectionChanged();
  });
  $('clear-sel').addEventListener('click', () => {
    selectError.hidden = true;
    ctx.state.selected = new Set();
    ctx.selectionChanged();
  });
  $('reset-zoom').addEventListener('click', () => {
    for (const c of ctx.charts.values()) c.chart.dispatchAction({ type: 'dataZoom', start: 0, end: 100 }, { silent: true });
    ctx.state.zoom = null;
    writeUrl(ctx.state);
    ctx.refetchZoom();
  });
  $('heat-metric').addEventListener('change', (e) => {
    ctx.state.heatMetric = e.target.value;
    writeUrl(ctx.state);
    ctx.loadHeatmap().catch(ctx.showError);
  });
  $('legend').addEventListener('click', (e) => {
    const chip = e.target.closest('[data-rank]');
    if (chip) ctx.app.toggleRank(Number(chip.dataset.rank));
  });
  $('rank-body').addEventListener('click', (e) => {
    const row = e.target.closest('tr[data-rank]');
    if (row) ctx.app.toggleRank(Number(row.dataset.rank));
  });
  $('rank-head').addEventListener('click', (e) => {
    const th = e.target.closest('th[data-key]');
    if (!th) return;
    const key = th.dataset.key;
    ctx.state.sort = { key, dir: ctx.state.sort.key === key ? -ctx.state.sort.dir : key === 'z' ? -1 : 1 };
    ctx.renderPanels();
  });
  window.addEventListener('resize', debounce(() => {
    for (const c of ctx.charts.values()) c.chart.resize();
    ctx.heatmap().chart.resize();
  }, 150));
  window.addEventListener('hashchange', () => {
    const before = ctx.state.run;
    const refBefore = [ctx.state.ref, ctx.state.refNone].join('\n');
    readUrl(ctx.state);
    syncControls(ctx.state);
    if (ctx.state.run !== before) ctx.selectRun(ctx.state.run, false).catch(ctx.showError);
    else {
      if ([ctx.state.ref, ctx.state.refNone].join('\n') !== refBefore) ctx.loadRef().catch(ctx.showError);
      for (const c of ctx.charts.values()) c.needsFull = true;
      ctx.reloadAllSeries().catch(ctx.showError);
      ctx.renderPanels();
    }
  });
}

export function syncControls(state) {
  $('log').checked = state.log;
  $('ema').value = String(state.ema);
  $('ema-out').textContent = state.ema ? state.ema.toFixed(2) : 'off';
  $('view').value = state.view;
  $('select-input').value = formatRanks(state.selected);
}
