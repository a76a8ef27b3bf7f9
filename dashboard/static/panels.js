// The page's plain-DOM parts: run picker, freshness, alert banner, rank legend, rank table.
// All text goes in through textContent (util.el): a run called "<img src=x onerror=...>"
// is shown as those characters, never parsed.

import { peaks } from './heatmap.js';
import { ago, el, fmt, fmtZ, num } from './util.js';

const STALE_AFTER_S = 30; // "last record" turns red past this while the run is not finished
const BANNER_MAX_ALERTS = 3;
const LEGEND_MAX_CHIPS = 64; // past this the legend lists only the ranks drawn one by one

const runLabel = (r) => `${r.run} (${r.state ?? '?'}, ${r.world_size?.toLocaleString('en-US') ?? '?'} ranks)`;

// The same runs keep their options (an open list stays open); their states change in place.
export function renderRunPicker(select, runs, current) {
  const names = runs.map((r) => r.run);
  const have = [...select.options];
  if (names.length === have.length && names.every((n, i) => n === have[i].value)) {
    runs.forEach((r, i) => { if (have[i].textContent !== runLabel(r)) have[i].textContent = runLabel(r); });
    select.value = current ?? '';
    return;
  }
  select.replaceChildren(...runs.map((r) => {
    const opt = el('option', {}, runLabel(r));
    opt.value = r.run;
    return opt;
  }));
  select.value = current ?? '';
}

export function renderFreshness(node, stateNode, run, serverNow) {
  if (!run) {
    node.textContent = 'no runs yet: start a job with the rankwatch agent';
    node.className = 'fresh';
    stateNode.textContent = '';
    return;
  }
  const age = run.last_time != null ? serverNow - run.last_time : null;
  const finished = ['finished', 'crashed', 'history'].includes(run.state);
  node.textContent = age === null ? 'no records yet' : `last record ${ago(age)} ago`;
  node.className = age !== null && age > STALE_AFTER_S && !finished ? 'fresh stale' : 'fresh';
  stateNode.textContent = run.state ?? '';
  stateNode.className = `pill state-${String(run.state ?? 'unknown').replace(/[^a-z]/g, '')}`;
}

// An alert's message carries the z of the step it was first reported at ("(z=14.2)"); the
// table shows the z of the latest step. Say which is which, and add the z now beside it.
function labelZ(message) {
  return String(message).replace(/\(z=([^)]+)\)/g, '(z at first report $1)');
}

function zNow(alert, ranks) {
  if (alert.rank === null || alert.rank === undefined || !alert.metric) return null;
  const r = (ranks || []).find((x) => x.rank === alert.rank);
  return r ? num((r.z || {})[alert.metric]) : null;
}

function alertLine(alert, serverNow, ranks) {
  let who = 'run';
  if (alert.rank !== null && alert.rank !== undefined) who = `rank ${alert.rank}`;
  else if (Array.isArray(alert.ranks) && alert.ranks.length) {
    const listed = alert.ranks.slice(0, 5).join(', ');
    who = `${alert.ranks.length} ranks (${listed}${alert.ranks.length > 5 ? ', …' : ''})`;
  }
  const what = alert.metric ? ` · ${alert.metric}` : '';
  const since = [];
  if (alert.since_step !== null && alert.since_step !== undefined) since.push(`step ${alert.since_step}`);
  if (alert.since_time) since.push(`${ago(serverNow - alert.since_time)} ago`);
  const line = el('div', { class: `alert sev-${String(alert.severity || 'warning').replace(/[^a-z]/g, '')}` });
  line.append(
    el('strong', {}, `${who}${what}`),
    el('span', { class: 'since' }, since.length ? ` since ${since.join(', ')}` : ''),
    el('span', { class: 'msg' }, alert.message ? ` — ${labelZ(alert.message)}` : ''),
  );
  const now = zNow(alert, ranks);
  if (now !== null) line.append(el('span', { class: 'znow' }, ` · z now ${fmtZ(now)}`));
  return line;
}

export function renderBanner(node, firing, serverNow, ranks = []) {
  if (!firing.length) {
    node.hidden = true;
    node.replaceChildren();
    return;
  }
  node.hidden = false;
  // The alert that began first leads: in a NaN storm that is the rank that went first.
  const since = (a) => a.since_step ?? Infinity;
  const ordered = [...firing].sort((a, b) => since(a) - since(b) || (a.rank ?? -1) - (b.rank ?? -1));
  const lines = ordered.slice(0, BANNER_MAX_ALERTS).map((a) => alertLine(a, serverNow, ranks));
  if (firing.length > BANNER_MAX_ALERTS) lines.push(el('div', { class: 'more' }, `+${firing.length - BANNER_MAX_ALERTS} more alerts`));
  node.replaceChildren(...lines);
}

export function renderLegend(node, app) {
  const st = app.state;
  const all = st.ranks.map((r) => r.rank);
  const highlighted = app.highlighted();
  const total = app.ranksTotal ? app.ranksTotal() : all.length; // a paged table holds a page
  const many = total > LEGEND_MAX_CHIPS;
  const shown = many ? [...new Set([...highlighted, ...st.selected])].sort((a, b) => a - b) : all;
  const chips = shown.map((rank) => {
    const chip = el('button', { type: 'button', class: 'chip', title: `rank ${rank}: click to select` }, `rank ${rank}`);
    chip.dataset.rank = String(rank);
    if (highlighted.has(rank)) chip.classList.add('divergent');
    if (st.selected.has(rank)) chip.classList.add('selected');
    return chip;
  });
  const note = many
    ? el('span', { class: 'legend-note' }, `${total.toLocaleString('en-US')} ranks: median and bands, plus the ranks listed here. Pick more in the table or heatmap.`)
    : el('span', { class: 'legend-note' }, 'click a rank to select it');
  node.replaceChildren(...chips, note);
}

// The largest |z| of the rank in the heatmap's last read of this metric (null: not read).
function peakZ(rank, metric) {
  const p = peaks.get(metric);
  const best = p && p.get(rank);
  return best ? best.z : null;
}

const COLUMNS = [
  { key: 'rank', label: 'rank', get: (r) => r.rank },
  { key: 'host', label: 'host', get: (r) => r.host ?? '' },
  { key: 'state', label: 'state', get: (r) => r.state ?? '' },
  { key: 'last_step', label: 'last step', get: (r) => r.last_step },
  { key: 'loss', label: 'last loss', get: (r, m) => num((r.values || {})[m]) },
  { key: 'z', label: 'z now', get: (r, m) => num((r.z || {})[m]) },
  { key: 'peak', label: 'peak z', get: (r, m) => peakZ(r.rank, m) },
  { key: 'throughput', label: 'throughput', get: (r) => num(r.throughput) },
  { key: 'last_seen', label: 'last seen', get: (r) => r.last_seen },
];

export function renderTableHead(thead, app) {
  const st = app.state;
  const row = el('tr');
  for (const col of COLUMNS) {
    const m = app.tableMetric();
    let label = col.label;
    if (col.key === 'loss') label = `last ${m}`;
    else if (col.key === 'z') label = `z now (${m})`;
    else if (col.key === 'peak') label = `peak z (${m})`;
    const th = el('th', { scope: 'col' }, label);
    th.dataset.key = col.key;
    if (st.sort.key === col.key) th.classList.add(st.sort.dir > 0 ? 'asc' : 'desc');
    row.append(th);
  }
  thead.replaceChildren(row);
}

const missing = (v) => v === null || v === undefined || (typeof v === 'number' && Number.isNaN(v));

export function renderTable(tbody, app, serverNow) {
  const st = app.state;
  const metric = app.tableMetric();
  const col = COLUMNS.find((c) => c.key === st.sort.key) || COLUMNS[0];
  // z sorts by distance from the others, whichever side; missing values always go last.
  const key = (r) => {
    const v = col.get(r, metric);
    return (col.key === 'z' || col.key === 'peak') && typeof v === 'number' ? Math.abs(v) : v;
  };
  const rows = st.ranks.map((r) => [key(r), r]).sort(([va, a], [vb, b]) => {
    if (missing(va) || missing(vb)) return missing(va) - missing(vb) || a.rank - b.rank;
    const c = typeof va === 'string' ? va.localeCompare(vb) : va - vb;
    return c === 0 ? a.rank - b.rank : c * st.sort.dir;
  }).map(([, r]) => r);
  const highlighted = app.highlighted();
  const frag = document.createDocumentFragment();
  for (const r of rows) {
    const tr = el('tr');
    tr.dataset.rank = String(r.rank);
    if (highlighted.has(r.rank)) tr.classList.add('divergent');
    if (st.selected.has(r.rank)) tr.classList.add('selected');
    const z = num((r.z || {})[metric]);
    const peak = peakZ(r.rank, metric);
    const flagged = (r.divergent || []).includes(metric);
    const cells = [
      r.rank,
      r.host ?? '',
      r.state ?? '',
      r.last_step ?? '–',
      fmt(num((r.values || {})[metric])),
      fmtZ(z),
      fmtZ(peak),
      fmt(num(r.throughput)),
      r.last_seen ? `${ago(serverNow - r.last_seen)} ago` : '–',
    ];
    cells.forEach((text, i) => {
      const td = el('td', {}, text);
      if (i === 2) td.className = `state-${String(r.state ?? '').replace(/[^a-z]/g, '')}`;
      // Red says what the detector says: this rank is flagged on this metric. A large z it
      // never confirmed (one step's jump) stays plain, as on the heatmap.
      if (i === 5 && flagged) td.className = 'zbad';
      if (i === 6) td.className = 'zpeak';
      tr.append(td);
    });
    if (r.message) tr.title = String(r.message);
    frag.append(tr);
  }
  tbody.replaceChildren(frag);
  renderTableStep(tbody, st.ranks);
}

// "at step N" beside the table's title: the newest step any rank reported, the step the
// charts and the heatmap say they are at, so a person sees the panels agree.
function renderTableStep(tbody, ranks) {
  const head = tbody.closest('.card')?.querySelector('h2');
  if (!head) return;
  let tag = head.querySelector('.step-tag');
  if (!tag) {
    tag = el('span', { class: 'chart-info step-tag', id: 'table-step' });
    head.append(tag);
  }
  const steps = ranks.map((r) => r.last_step).filter((s) => typeof s === 'number');
  tag.textContent = steps.length ? `at step ${Math.max(...steps)}` : '';
}
