// The rank table of a run of many ranks: one page at a time, sorted, filtered and counted by
// the server (GET /api/run/ranks?page=&size=&sort=&filter=&host=). The page never holds more
// than a page of rows; the odd ranks (culprit, crashed, flagged, affected, stalled) come first
// unless a header asks otherwise. A node picked on the node map filters the table to its ranks.

import { ago, api, debounce, el, fmt, fmtZ, num, runPath } from './util.js';

export const PAGED_RANKS = 1024; // above this many ranks the table is paged on the server
const FILTER_DELAY_MS = 300;

const $ = (id) => document.getElementById(id);

// header label -> the server's sort key; z sorts by distance, largest first
const COLUMNS = [
  { sort: 'rank', label: () => 'rank' },
  { sort: 'host', label: () => 'host' },
  { sort: 'state', label: () => 'state' },
  { sort: 'z', label: (m) => `z now (${m})` }, // before the value: on a phone it is what shows
  { sort: 'value', label: (m) => `last ${m}` },
  { sort: 'last_step', label: () => 'last step' },
  { sort: null, label: () => 'last seen' },
];
const FIRST_DESC = new Set(['z']);

export function rankPager({ state, app, onRows, showError }) {
  const query = { sort: 'attention', desc: null, page: 1, size: 100, filter: '', host: null, range: null };
  let answer = null;
  let seq = 0;

  function params() {
    const p = { page: query.page, size: query.size, sort: query.sort, metric: app.tableMetric() };
    if (query.desc !== null) p.desc = query.desc ? 1 : 0;
    const filter = query.range || query.filter;
    if (filter) p.filter = filter;
    if (query.host) p.host = query.host;
    return p;
  }

  async function load() {
    if (!state.run) return null;
    const run = state.run;
    const mine = ++seq;
    const resp = await api(runPath(run, 'ranks'), params());
    if (resp.run !== state.run || mine !== seq) return null; // a newer read is on its way
    answer = resp;
    query.page = resp.page;
    onRows(resp);
    return resp;
  }

  const reload = () => load().catch(showError);

  function renderHead(thead) {
    const metric = answer?.metric ?? app.tableMetric();
    const row = el('tr');
    for (const col of COLUMNS) {
      const th = el('th', { scope: 'col' }, col.label(metric));
      if (col.sort) {
        th.dataset.sort = col.sort; // not data-key: the small table's sorting stays out of it
        if (query.sort === col.sort) th.classList.add(answer?.desc ? 'desc' : 'asc');
      } else th.className = 'nosort';
      row.append(th);
    }
    thead.replaceChildren(row);
  }

  function renderBody(tbody, serverNow) {
    const metric = answer?.metric ?? app.tableMetric();
    const highlighted = app.highlighted();
    const frag = document.createDocumentFragment();
    for (const r of answer?.rows || []) {
      const tr = el('tr');
      tr.dataset.rank = String(r.rank);
      if (highlighted.has(r.rank) || r.flagged) tr.classList.add('divergent');
      if (state.selected.has(r.rank)) tr.classList.add('selected');
      const cells = [
        r.rank, r.host, r.state, fmtZ(num(r.z)), fmt(num(r.value)), r.last_step ?? '–',
        r.last_seen ? `${ago(serverNow - r.last_seen)} ago` : '–',
      ];
      cells.forEach((text, i) => {
        const td = el('td', {}, text);
        if (i === 2) td.className = `state-${String(r.state ?? '').replace(/[^a-z]/g, '')}`;
        if (i === 3 && (r.divergent || []).includes(metric)) td.className = 'zbad';
        tr.append(td);
      });
      if (r.message) tr.title = r.message;
      frag.append(tr);
    }
    tbody.replaceChildren(frag);
  }

  function renderBar() {
    const a = answer;
    $('rank-pager').hidden = false;
    if (!a) return;
    const n = (x) => Number(x).toLocaleString('en-US');
    $('rank-showing').textContent = a.matched
      ? `showing ${n(a.first)}–${n(a.last)} of ${n(a.matched)}${a.matched < a.total ? ` (of ${n(a.total)} ranks)` : ''}`
      : `no rank matches (of ${n(a.total)})`;
    $('rank-prev').disabled = a.page <= 1;
    $('rank-next').disabled = a.page >= a.pages;
    $('rank-odd').hidden = query.sort === 'attention';
    const node = $('rank-node');
    const picked = query.host || query.range;
    node.hidden = !picked;
    node.textContent = picked ? `${query.host || `ranks ${query.range}`} ×` : '';
    node.title = 'show every rank again';
    const odd = Object.entries(a.levels || {}).filter(([name]) => name !== 'ok' && name !== 'far');
    const parts = odd.reverse().map(([name, count]) => `${n(count)} ${name}`);
    $('rank-counts').textContent = `${n(a.total)} ranks${parts.length ? ` · ${parts.join(' · ')}` : ''}`;
  }

  function render(thead, tbody, serverNow) {
    renderHead(thead);
    renderBody(tbody, serverNow);
    renderBar();
  }

  // Every rank of a node (host) or block (a rank range): the table shows them, first page.
  function drill(cell) {
    query.host = cell && cell.host ? cell.host : null;
    query.range = cell && !cell.host ? `${cell.first}-${cell.last}` : null;
    query.page = 1;
    return load();
  }

  function reset() {
    Object.assign(query, { sort: 'attention', desc: null, page: 1, filter: '', host: null, range: null });
    $('rank-filter').value = '';
    answer = null;
  }

  function bind(onClearNode) {
    $('rank-prev').addEventListener('click', () => { query.page = Math.max(1, query.page - 1); reload(); });
    $('rank-next').addEventListener('click', () => { query.page += 1; reload(); });
    $('rank-size').addEventListener('change', (e) => {
      query.size = Number(e.target.value);
      query.page = 1;
      reload();
    });
    $('rank-odd').addEventListener('click', () => {
      Object.assign(query, { sort: 'attention', desc: null, page: 1 });
      reload();
    });
    $('rank-node').addEventListener('click', () => {
      drill(null).catch(showError);
      onClearNode();
    });
    $('rank-filter').addEventListener('input', debounce((e) => {
      query.filter = e.target.value.trim();
      query.page = 1;
      reload();
    }, FILTER_DELAY_MS));
    $('rank-head').addEventListener('click', (e) => {
      const th = e.target.closest('th[data-sort]');
      if (!th) return;
      const key = th.dataset.sort;
      const down = query.sort === key ? !(answer?.desc ?? FIRST_DESC.has(key)) : FIRST_DESC.has(key);
      Object.assign(query, { sort: key, desc: down, page: 1 });
      reload();
    });
  }

  return {
    load, render, drill, reset, bind,
    get answer() { return answer; },
    get query() { return query; },
  };
}
