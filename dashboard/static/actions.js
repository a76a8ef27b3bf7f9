// Checkpoint and stop from the page (docs/actions.md): two buttons on the run, and the same two
// on an open incident's card (the press then names the incident, so the commands history says
// where it came from). A confirmation names the run and its live ranks; the server acts only
// with a token (serve --token) and otherwise says why it refused; the answer of every rank is
// followed here for a while.

import { api } from './util.js';

const LIVE = new Set(['alive', 'stalled', 'paused']);
const OVER = new Set(['finished', 'history']); // run states (GET /api/runs) with no live rank
const FOLLOW_MS = 1000; // how often the ranks' answers are read after a press ...
const FOLLOW_FOR_MS = 30000; // ... and for how long
const WORDS = {
  checkpoint: ['Checkpoint', 'at the end of the next agreed step; training goes on'],
  stop: ['Stop', 'after the next agreed step: every rank finishes that step, then training ends'],
};

export function bindActions(getRun) {
  const box = document.getElementById('actions');
  if (!box) return;
  for (const button of box.querySelectorAll('button[data-cmd]')) {
    button.addEventListener('click', () => press(button.dataset.cmd, getRun()));
  }
}

export function showActions(run) {
  const box = document.getElementById('actions');
  if (box) box.hidden = !run;
  say('', '');
}

// Whether commands can reach the run: the server takes them only while it has a rank alive,
// stalled or paused. run: its entry in GET /api/runs; ranks: its rank table, or null where the
// page holds only a page of it (a run of many ranks), when the run's state alone decides.
export function runIsLive(run, ranks) {
  if (!run || OVER.has(run.state)) return false;
  return !ranks || ranks.length === 0 || ranks.some((r) => LIVE.has(r.state));
}

// The run's buttons go once it is over; what the last press did stays beside them.
export function setLive(live) {
  const box = document.getElementById('actions');
  if (!box) return;
  for (const button of box.querySelectorAll('button[data-cmd]')) button.hidden = !live;
}

function say(text, kind, out = document.getElementById('action-result')) {
  if (!out) return;
  out.textContent = text;
  out.className = `action-result ${kind}`;
}

// A press of a command button. incident: the id of the incident whose card it is on (or '');
// out: where the outcome is written (default: beside the run's buttons).
export async function press(cmd, run, incident = '', out = undefined) {
  if (!run || !WORDS[cmd]) return;
  const tell = (text, kind) => say(text, kind, out);
  let live = [];
  try {
    const body = await api('/api/run/ranks', { run });
    live = (body.ranks || []).filter((r) => LIVE.has(r.state));
  } catch (err) {
    tell(`cannot read the ranks of ${run}: ${err.message}`, 'refused');
    return;
  }
  const [verb, when] = WORDS[cmd];
  const from = incident ? ` (from incident ${incident})` : '';
  if (!window.confirm(`${verb} run "${run}" on its ${live.length} live rank(s) ${when}?${from}`)) {
    tell('cancelled', '');
    return;
  }
  const url = new URL('/api/run/commands', window.location.origin);
  url.searchParams.set('run', run);
  let res;
  let body = {};
  try {
    res = await fetch(url, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify(incident
        ? { cmd, incident, reason: `pressed on the card of incident ${incident}` }
        : { cmd, reason: 'pressed on the page' }),
    });
    body = await res.json().catch(() => ({}));
  } catch (err) {
    tell(`not sent: ${err.message}`, 'refused');
    return;
  }
  if (!res.ok) {
    const detail = typeof body.detail === 'string' ? body.detail : `HTTP ${res.status}`;
    tell(`refused: ${detail}`, 'refused');
    return;
  }
  tell(`${cmd} sent to ${body.ranks.length} rank(s) for the end of step ${body.step}`, 'sent');
  follow(run, body.id, cmd, Date.now(), tell);
}

async function follow(run, id, cmd, since, tell) {
  let got = null;
  try {
    const body = await api('/api/run/commands', { run });
    got = (body.commands || []).find((c) => c.id === id) || null;
  } catch (_) { /* the next read may work */ }
  if (got) {
    const counts = Object.entries(got.counts || {}).map(([s, n]) => `${n} ${s}`).join(', ');
    tell(`${cmd} at step ${got.step}: ${counts}`, got.state === 'done' ? 'done' : 'sent');
    if (got.state !== 'waiting') return;
  }
  if (Date.now() - since < FOLLOW_FOR_MS) setTimeout(() => follow(run, id, cmd, since, tell), FOLLOW_MS);
}
