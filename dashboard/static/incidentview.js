// The incident card, its history and the folded alert lines, wired to the page: the reads,
// the stream's changes, the clicks. What they show and each rank's role live in incidents.js.
//
// ctx: {state, serverNow(), restyle(), live()}: restyle redraws the charts, table and chips
// after a change of roles; live says whether the run can still take commands.

import { press } from './actions.js';
import * as incidents from './incidents.js';
import { STALE, api, formatRanks, newestOnly, runPath } from './util.js';

const ZOOM_STEPS = 20; // steps either side of the fault step, as in the alerts' links

const $ = (id) => document.getElementById(id);

export function incidentView(ctx) {
  const { state } = ctx;

  function render() {
    incidents.renderIncidentCard($('incident'), state.ranks, ctx.serverNow(), ctx.live());
    incidents.renderHistory($('incident-history'), ctx.serverNow(), ctx.live());
    renderAlertsToggle();
  }

  // The card and history follow every change; charts, table and chips only a change of roles
  // (an incident's evidence grows every step while it fires: that must not redraw 1,024 ranks).
  function changed(what) {
    if (!what) return;
    render();
    if (what.roles) ctx.restyle();
  }

  const readIncidents = newestOnly(api);
  async function load() {
    if (!state.run) return;
    const run = state.run;
    const resp = await readIncidents(runPath(run, 'incidents'));
    if (resp === STALE || resp.run !== run || run !== state.run) return;
    changed(incidents.setIncidents(resp.incidents));
  }

  // A stream message; false when it carried no incident and the caller should read them again.
  function onMessage(msg) {
    if (!msg.incident) return false;
    if (msg.incident.run === state.run) changed(incidents.applyIncidentChange(msg));
    return true;
  }

  function reset() {
    incidents.setIncidents([]);
    incidents.focusIncident(null);
    render();
  }

  let historyLive = true;
  function tick() {
    const live = ctx.live();
    incidents.renderIncidentCard($('incident'), state.ranks, ctx.serverNow(), live); // rebuilt on change only
    if (live !== historyLive) incidents.renderHistory($('incident-history'), ctx.serverNow(), live);
    historyLive = live;
    incidents.refreshAges($('incident-history'), ctx.serverNow());
    renderAlertsToggle();
  }

  // With an incident on the card, the per-rank alert lines (one per rank and metric, in rank
  // order, so a NaN that spread starts with "rank 0") fold behind one button.
  function renderAlertsToggle() {
    const toggle = $('alerts-toggle');
    const n = state.firing.length;
    toggle.hidden = !incidents.shown() || n === 0;
    const open = document.body.classList.contains('alerts-open');
    toggle.textContent = open ? `hide the ${n} alert lines` : `${n} ${n === 1 ? 'alert' : 'alerts'} firing: show them`;
  }

  function bind() {
    $('incident').addEventListener('click', (e) => {
      const action = e.target.closest('[data-action]')?.dataset.action;
      const inc = incidents.shown();
      if (action === 'cmd' && inc) {
        press(e.target.closest('[data-cmd]').dataset.cmd, state.run, inc.id, incidents.commandResult(inc.id));
      } else if (action === 'timeline') {
        incidents.toggleTimeline();
        render();
      } else if (action === 'zoom' && inc) {
        // The link the alert messages carry: the culprits selected, zoomed around the fault step.
        const p = new URLSearchParams({ run: state.run, sel: formatRanks(new Set(inc.culprits)) });
        p.set('zoom', `${Math.max(inc.step - ZOOM_STEPS, 0)}-${inc.step + ZOOM_STEPS}`);
        window.location.hash = p.toString();
      }
    });
    $('incident-history').addEventListener('click', (e) => {
      const item = e.target.closest('li[data-incident]');
      if (item) changed(incidents.focusIncident(item.dataset.incident));
    });
    $('alerts-toggle').addEventListener('click', () => {
      document.body.classList.toggle('alerts-open');
      renderAlertsToggle();
    });
  }

  return { load, onMessage, reset, tick, renderAlertsToggle, bind };
}
