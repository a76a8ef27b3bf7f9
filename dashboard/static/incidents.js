// Incidents on the page: the card at the top (culprit, host, pid, the cause in one sentence,
// the timeline, who was affected), the history of the run's incidents, and each rank's role
// in them, which the table, the chips and the charts colour by (rankRole, roleStyle).
//
// Incidents come from GET /api/run/incidents (newest first) and the stream's "incident"
// messages; the aggregator's words (summary, basis, timeline "what") are shown as text.

import { ago, el, formatRanks } from './util.js';

const TIMELINE_SHOWN = 4; // rows before "show all": the culprit's evidence comes first
const MESSAGE_LINE_MAX = 140; // characters of the crash line on the card; the rest on a click
const RANKS_LISTED = 12;
const CULPRITS_NAMED = 4; // culprits shown each with host and pid; past it, one line of ranks // "affected after it: 0, 1, 3" lists this many, then "+N more"
const CAUSE_WORDS = {
  nonfinite: 'non-finite values', divergence: 'divergence', hang: 'hang', crash: 'crash',
  lost: 'rank lost', slow: 'slow rank',
};
// The culprit alone is red; ranks the fault reached are a quieter dashed orange-grey, so a
// NaN that spread to every rank still shows the one rank it started on.
const ROLE_STYLES = {
  culprit: { kind: 'culprit', color: '#d62728', width: 3.2, opacity: 1, z: 8, endLabel: true },
  affected: { kind: 'affected', color: '#d9a06b', width: 1.4, opacity: 0.9, z: 4, type: 'dashed', endLabel: false },
  terminated: { kind: 'terminated', color: '#a8a29e', width: 1.2, opacity: 0.8, z: 3, type: 'dotted', endLabel: false },
};
const ROLE_ORDER = ['culprit', 'affected', 'terminated'];

const model = {
  incidents: [], // newest first, as the API returns them
  focused: null, // id picked in the history, else the card shows the default (see shown())
  roles: new Map(), // rank -> role
  showAllTimeline: false,
};

// Returns what changed: null for nothing (a poll that finds the same incidents redraws
// nothing), else {roles}: whether any rank's role changed (only then do charts restyle).
export function setIncidents(list) {
  const fresh = Array.isArray(list) ? list.filter((i) => i && typeof i.id === 'string') : [];
  if (JSON.stringify(fresh) === JSON.stringify(model.incidents)) return null;
  model.incidents = fresh;
  return { roles: recomputeRoles() };
}

// One change from the stream: the incident replaces the one with its id, or joins, newest first.
// The stream's incident carries no commands: those read before stay on it.
export function applyIncidentChange(msg) {
  let inc = msg && msg.incident;
  if (!inc || typeof inc.id !== 'string') return null;
  const before = model.incidents.find((i) => i.id === inc.id);
  if (before && before.actions && !inc.actions) inc = { ...inc, actions: before.actions };
  const rest = model.incidents.filter((i) => i.id !== inc.id);
  return setIncidents([inc, ...rest].sort((a, b) => (b.opened ?? 0) - (a.opened ?? 0)));
}

export function incidents() {
  return model.incidents;
}

export function focusIncident(id) {
  model.focused = id;
  return { roles: recomputeRoles() };
}

// The incident the card shows: the one picked in the history, else the newest firing one,
// else the newest (a finished run keeps its card).
export function shown() {
  const list = model.incidents;
  return list.find((i) => i.id === model.focused)
    || list.find((i) => i.state === 'firing')
    || list[0]
    || null;
}

// Ranks take their role from the shown incident and every other firing one; culprit wins.
// An incident with more culprits than the card names ("every rank at once: no single
// culprit") gives no roles: painting a thousand ranks red would point at none of them.
// Returns whether any rank's role changed.
function recomputeRoles() {
  const roles = new Map();
  const from = [shown(), ...model.incidents.filter((i) => i.state === 'firing')]
    .filter((i) => i && !noSingleCulprit(i));
  for (const role of ROLE_ORDER) {
    for (const inc of from) {
      const ranks = role === 'culprit' ? inc.culprits : role === 'affected' ? inc.affected : inc.terminated;
      for (const r of ranks || []) if (!roles.has(r)) roles.set(r, role);
    }
  }
  const same = roles.size === model.roles.size
    && [...roles].every(([rank, role]) => model.roles.get(rank) === role);
  model.roles = roles;
  return !same;
}

export function rankRole(rank) {
  return model.roles.get(rank) ?? null;
}

// The chart style for a rank's role (charts.js rankStyle asks first), or null for none. A rank
// the user selected keeps its selection colour unless it is the culprit.
export function roleStyle(rank, selected = new Set()) {
  const role = rankRole(rank);
  if (!role || (role !== 'culprit' && selected.has(rank))) return null;
  return { ...ROLE_STYLES[role] };
}

export function hasIncident() {
  return model.incidents.length > 0;
}

// "3 min ago", kept current by refreshAges without rebuilding the card (an open message or a
// selection in it survives the page's every-second tick).
function agoSpan(t, serverNow, prefix = '', suffix = '') {
  const span = el('span', { class: 'inc-ago' }, `${prefix}${ago(serverNow - t)} ago${suffix}`);
  Object.assign(span.dataset, { t: String(t), prefix, suffix });
  return span;
}

export function refreshAges(root, serverNow) {
  for (const span of root.querySelectorAll('.inc-ago[data-t]')) {
    const { t, prefix, suffix } = span.dataset;
    span.textContent = `${prefix}${ago(serverNow - Number(t))} ago${suffix}`;
  }
}

function clock(t) {
  if (typeof t !== 'number' || !Number.isFinite(t)) return '–';
  return new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
}

function rankList(ranks) {
  const listed = ranks.slice(0, RANKS_LISTED).join(', ');
  return ranks.length > RANKS_LISTED ? `${listed}, +${ranks.length - RANKS_LISTED} more` : listed;
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

// "rank 2 · node0 · pid 1002" for each culprit, from the rank table (host and pid per rank).
// More culprits than the card names, or every rank at once (the rules' basis says so): the
// fault is the job's, its network's or the head's, not one card's.
function noSingleCulprit(inc) {
  return (inc.culprits || []).length > CULPRITS_NAMED || String(inc.basis || '').startsWith('every rank');
}

function culpritLine(inc, ranksByNumber) {
  const line = el('div', { class: 'inc-culprit' });
  const culprits = inc.culprits || [];
  if (!culprits.length) {
    line.append(el('span', { class: 'inc-who' }, 'no culprit named yet'));
    return line;
  }
  if (noSingleCulprit(inc)) { // a count, not a wall of red
    const who = el('span', { class: 'inc-who' });
    who.append(el('strong', {}, `${culprits.length} ranks`));
    line.append(who);
    line.append(el('span', { class: 'inc-where' }, ` ${formatRanks(new Set(culprits))}`));
    return line;
  }
  for (const rank of culprits) {
    const r = whereOf(inc, rank, ranksByNumber.get(rank)) || {};
    const who = el('span', { class: 'inc-who' });
    who.append(el('strong', {}, `rank ${rank}`));
    const where = [r.host, r.pid !== null && r.pid !== undefined ? `pid ${r.pid}` : null].filter(Boolean);
    if (where.length) who.append(el('span', { class: 'inc-where' }, ` ${where.join(' · ')}`));
    line.append(who);
  }
  return line;
}

// An incident's state in words: one still open when its run ended is not firing now, and no
// command can reach the run any more.
function stateOf(inc, live) {
  if (inc.state !== 'firing') return { cls: 'resolved', words: 'resolved' };
  return live ? { cls: 'firing', words: 'FIRING' } : { cls: 'ended', words: 'open when the run ended' };
}

function stateLine(inc, serverNow, live) {
  const { cls, words } = stateOf(inc, live);
  const line = el('div', { class: 'inc-state' });
  line.append(el('span', { class: `inc-pill ${cls}` }, words));
  line.append(el('span', { class: 'inc-when' }, ` opened ${clock(inc.opened)} `), agoSpan(inc.opened, serverNow, '(', ')'));
  if (cls === 'resolved' && typeof inc.resolved === 'number') {
    line.append(el('span', { class: 'inc-when' }, `, resolved ${clock(inc.resolved)} `), agoSpan(inc.resolved, serverNow, '(', ')'));
  }
  return line;
}

// Who a timeline item is about: one rank, or a group of ranks alike in it (count, and the
// ranks as [first, last] ranges, which may list fewer than count). Items stored before groups
// have no count: one rank each.
export function evidenceRanks(ev) {
  const count = Number.isInteger(ev?.count) ? ev.count : 1;
  if (count <= 1) return { who: `rank ${ev?.rank}`, which: '' };
  const spans = (Array.isArray(ev.ranks) ? ev.ranks : []).filter(
    (s) => Array.isArray(s) && s.length === 2 && Number.isInteger(s[0]) && Number.isInteger(s[1]));
  const listed = spans.map(([a, b]) => (a === b ? String(a) : `${a}-${b}`)).join(', ');
  const covered = spans.reduce((n, [a, b]) => n + (b - a + 1), 0);
  const which = listed ? ` (ranks ${listed}${covered < count ? ', …' : ''})` : '';
  return { who: `${count} ranks`, which };
}

function timeline(inc) {
  const rows = Array.isArray(inc.timeline) ? inc.timeline : [];
  const box = el('div', { class: 'inc-timeline' });
  if (!rows.length) return box;
  const culprits = new Set(inc.culprits || []);
  const shownRows = model.showAllTimeline ? rows : rows.slice(0, TIMELINE_SHOWN);
  const table = el('table', { class: 'inc-tl' });
  const body = el('tbody');
  for (const ev of shownRows) {
    const tr = el('tr');
    if (culprits.has(ev.rank)) tr.className = 'inc-tl-culprit';
    const group = evidenceRanks(ev);
    tr.append(
      el('td', {}, ev.step === null || ev.step === undefined ? '–' : `step ${ev.step}`),
      el('td', {}, clock(ev.time)),
      el('td', {}, group.who),
      el('td', { class: 'inc-what' }, (ev.what ?? '') + group.which),
    );
    body.append(tr);
  }
  table.append(body);
  box.append(table);
  // a group row stands for its count of pieces
  const standsFor = rows.reduce((n, ev) => n + (Number.isInteger(ev.count) && ev.count > 1 ? ev.count : 1), 0);
  const held = Math.max(inc.evidence_count || 0, standsFor);
  if (rows.length > TIMELINE_SHOWN) {
    const more = model.showAllTimeline
      ? 'show the first rows only'
      : `show all ${rows.length} rows${held > standsFor ? ` (of ${held} pieces kept)` : ''}`;
    box.append(el('button', { type: 'button', class: 'inc-more', 'data-action': 'timeline' }, more));
  } else if (held > standsFor) {
    box.append(el('div', { class: 'inc-note' }, `${held} pieces of evidence kept, ${standsFor} shown`));
  }
  return box;
}

// Where a rank ran: its entry, else what the incident stored (a restarted server has no live
// entry for a rank that crashed before it started).
function whereOf(inc, rank, entry) {
  if (entry && entry.host) return entry;
  const [host, pid] = (inc.hosts || {})[rank] || [];
  return host ? { ...(entry || {}), host, pid } : entry;
}

// The culprit's crash message: one line here, the whole text one click away.
function messageOf(inc, ranksByNumber) {
  const rank = (inc.culprits || [])[0];
  const r = ranksByNumber.get(rank);
  if (!r || !r.message) return null;
  const full = String(r.message);
  const line = String(r.message_line ?? full.split('\n')[0]); // the server's one line
  const box = el('details', { class: 'inc-message' });
  const short = line.length > MESSAGE_LINE_MAX ? `${line.slice(0, MESSAGE_LINE_MAX)}…` : line;
  box.append(el('summary', {}, `rank ${rank}: ${short}`), el('pre', {}, full));
  return box;
}

let cardKey = '';
// Where a press of the card's command buttons says how it went: one node, moved into every
// rebuilt card, so the outcome stays while the incident's evidence keeps changing the card.
let cmdResult = null;
let cmdResultFor = '';

export function commandResult(id) {
  if (!cmdResult) cmdResult = el('output', { class: 'action-result', id: 'inc-action-result' });
  if (cmdResultFor !== id) {
    cmdResultFor = id;
    cmdResult.textContent = '';
    cmdResult.className = 'action-result';
  }
  return cmdResult;
}

// Checkpoint and stop for an open incident (actions.js sends them): a confirmation first, and
// the server acts only with a token. Styled as commands, not as the card's harmless buttons.
function commandButtons(inc) {
  const box = el('div', { class: 'inc-cmds', role: 'group', 'aria-label': 'act on this run' });
  box.append(
    el('button', { type: 'button', class: 'inc-cmd checkpoint', 'data-action': 'cmd', 'data-cmd': 'checkpoint' }, 'checkpoint now'),
    el('button', { type: 'button', class: 'inc-cmd stop', 'data-action': 'cmd', 'data-cmd': 'stop' }, 'stop at the next step'),
    commandResult(inc.id),
  );
  return box;
}

// What a policy did about the incident (docs/actions.md), and the ranks' answers.
function actionLine(a) {
  const counts = Object.entries(a.counts || {}).map(([s, n]) => `${n} ${s}`).join(', ');
  const at = a.step !== null && a.step !== undefined ? ` at step ${a.step}` : '';
  return `action: ${a.cmd}${at} by ${a.by}${counts ? `: ${counts}` : ''}`;
}

// live: whether the run can still take commands (actions.js runIsLive); a run that is over gets
// no command buttons, and its open incidents read as open when it ended, not as firing.
export function renderIncidentCard(node, ranks, serverNow, live = true) {
  const inc = shown();
  document.body.classList.toggle('has-incident', !!inc);
  if (!inc) {
    cardKey = '';
    node.hidden = true;
    node.replaceChildren();
    return;
  }
  const byNumber = new Map((ranks || []).map((r) => [r.rank, r]));
  const about = (inc.culprits || []).slice(0, CULPRITS_NAMED).map((r) => {
    const e = whereOf(inc, r, byNumber.get(r)) || {};
    return [r, e.host, e.pid, e.message, e.message_line];
  });
  const key = JSON.stringify([inc, about, model.showAllTimeline, live]);
  if (key === cardKey) {
    refreshAges(node, serverNow);
    return;
  }
  cardKey = key;
  node.hidden = false;
  const { cls } = stateOf(inc, live);
  node.className = `incident card ${cls}`;
  const head = el('div', { class: 'inc-head' });
  head.append(
    el('span', { class: 'inc-label' }, `${CAUSE_WORDS[inc.cause] ?? String(inc.cause)} · ${(inc.culprits || []).length > 1 ? 'culprits' : 'culprit'}`),
    culpritLine(inc, byNumber),
  );
  const parts = [head, el('p', { class: 'inc-summary' }, inc.summary ? `${inc.summary}.` : '')];
  const affected = inc.affected || [];
  const terminated = inc.terminated || [];
  const spread = [];
  spread.push(affected.length
    ? `${plural(affected.length, 'rank', 'ranks')} affected after it: ${rankList(affected)}`
    : 'no other rank affected');
  if (terminated.length) spread.push(`${plural(terminated.length, 'rank', 'ranks')} terminated by the launcher: ${rankList(terminated)}`);
  parts.push(el('div', { class: 'inc-affected' }, spread.join(' · ')));
  const msg = messageOf(inc, byNumber);
  if (msg) parts.push(msg);
  parts.push(stateLine(inc, serverNow, live));
  for (const a of (inc.actions || []).slice().reverse()) parts.push(el('div', { class: 'inc-action' }, actionLine(a)));
  if (cls === 'firing') parts.push(commandButtons(inc));
  parts.push(el('div', { class: 'inc-basis' }, `${inc.id}${inc.basis ? ` · why this rank: ${inc.basis}` : ''}`));
  if (inc.step !== null && inc.step !== undefined && (inc.culprits || []).length) {
    parts.push(el('button', { type: 'button', class: 'inc-go', 'data-action': 'zoom' }, `show step ${inc.step} on the charts`));
  }
  const main = el('div', { class: 'inc-main' });
  main.append(...parts);
  node.replaceChildren(main, timeline(inc));
}

export function renderHistory(node, serverNow, live = true) {
  const list = model.incidents;
  node.hidden = list.length === 0;
  if (!list.length) {
    node.replaceChildren();
    return;
  }
  const open = node.querySelector('details')?.open ?? false;
  const box = el('details', { class: 'inc-history' });
  box.open = open;
  const unresolved = list.filter((i) => i.state === 'firing').length;
  const words = live ? 'firing' : 'open when the run ended';
  box.append(el('summary', {}, `incidents of this run: ${list.length}${unresolved ? ` (${unresolved} ${words})` : ''}`));
  const current = shown();
  const ul = el('ul');
  for (const inc of list) {
    const li = el('li', { class: inc === current ? 'current' : '' });
    li.dataset.incident = inc.id;
    const { cls, words } = stateOf(inc, live);
    li.append(
      el('span', { class: `inc-pill ${cls}` }, words),
      el('span', { class: 'inc-when' }, ` ${clock(inc.opened)} `),
      agoSpan(inc.opened, serverNow, '(', ') '),
      el('span', { class: 'inc-text' }, inc.summary ?? inc.id),
    );
    ul.append(li);
  }
  box.append(ul);
  node.replaceChildren(box);
}

export function toggleTimeline() {
  model.showAllTimeline = !model.showAllTimeline;
}

// Classes on the table rows and legend chips by role, and which rows a phone shows: the ranks
// that matter (a role, divergent, not alive or running, selected).
const ALIVE = new Set(['alive', 'running', 'finished']);

export function markRanks(tbody, legend, ranks, highlighted, selected) {
  const byNumber = new Map((ranks || []).map((r) => [r.rank, r]));
  let minor = 0;
  // Rows and chips are built afresh before each call: only ranks with a role get classes, so
  // 1,024 healthy rows cost a lookup each.
  for (const node of legend.querySelectorAll('[data-rank]')) {
    const role = rankRole(Number(node.dataset.rank));
    if (role) node.classList.add(`role-${role}`);
  }
  for (const node of tbody.rows) {
    const rank = Number(node.dataset.rank);
    const role = rankRole(rank);
    if (role) {
      node.classList.add(`role-${role}`);
      // The role in words too: a peer that "crashed" in a collective is not where to look.
      if (node.cells.length) node.cells[0].append(el('span', { class: 'role-tag' }, role));
      const host = node.cells[1];
      const stored = host && !host.textContent && whereOf(shown() || {}, rank, null);
      if (stored) host.textContent = stored.host;
      continue;
    }
    const r = byNumber.get(rank);
    if (!highlighted.has(rank) && !selected.has(rank) && ALIVE.has(r && r.state)) {
      node.classList.add('minor');
      minor += 1;
    }
  }
  return minor;
}
