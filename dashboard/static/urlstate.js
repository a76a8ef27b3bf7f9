// What a link reproduces: run, selected ranks, zoom, log scale, smoothing, view, heatmap
// metric and reference run (none given: the previous run of the job; noref=1: none), kept in the URL hash (a query string works too, for hand-written links).

import { formatRanks, parseRanks } from './util.js';

export function readUrl(state) {
  const hash = new URLSearchParams(window.location.hash.slice(1));
  const query = new URLSearchParams(window.location.search);
  const get = (k) => (hash.has(k) ? hash.get(k) : query.get(k));
  state.run = get('run');
  state.selected = parseRanks(get('sel'));
  state.log = get('log') === '1';
  state.ema = Math.min(0.99, Math.max(0, Number(get('ema')) || 0));
  state.view = ['auto', 'ranks', 'band'].includes(get('view')) ? get('view') : 'auto';
  const zoom = (get('zoom') || '').match(/^(-?\d+)-(-?\d+)$/);
  state.zoom = zoom ? { start: Number(zoom[1]), end: Number(zoom[2]) } : null;
  state.heatMetric = get('heat');
  state.ref = get('ref') || null;
  state.refNone = get('noref') === '1';
  if (query.has('token')) { // the server set a cookie: keep the secret out of history and links
    query.delete('token');
    const q = query.toString();
    window.history.replaceState(null, '', `${window.location.pathname}${q ? `?${q}` : ''}${window.location.hash}`);
  }
}

export function writeUrl(state) {
  const p = new URLSearchParams();
  if (state.run) p.set('run', state.run);
  if (state.selected.size) p.set('sel', formatRanks(state.selected));
  if (state.log) p.set('log', '1');
  if (state.ema > 0) p.set('ema', String(state.ema));
  if (state.view !== 'auto') p.set('view', state.view);
  if (state.zoom) p.set('zoom', `${state.zoom.start}-${state.zoom.end}`);
  if (state.heatMetric) p.set('heat', state.heatMetric);
  if (state.refNone) p.set('noref', '1');
  else if (state.ref) p.set('ref', state.ref);
  const hash = `#${p.toString()}`;
  if (hash !== window.location.hash) window.history.replaceState(null, '', hash);
}
