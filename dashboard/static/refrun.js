// The reference run laid over every chart ("is this run's loss at step 10k as good as last
// week's?"): its median across ranks per metric, one dashed line, and the comparison at the
// same step from /api/run/compare in a line under each chart's title.
//
// The choice lives in the URL: no `ref` is the previous run of the same job (the server picks
// it), `ref=NAME` a given run, `noref=1` none. The reference's lines are read once per choice:
// while this run streams, only the comparison is read again (it moves with this run's steps).

import { api, el, fmt, runPath, throttle } from './util.js';

// A live run's comparison is read again at most this often: one read costs about as much as
// all the page's own band reads (docs/benchmarks.md).
const COMPARE_REFRESH_MS = 10000;
const REF_MAX_POINTS = 2000; // the reference's median line, per metric

// What the picker's value means: 'auto', 'none', or '=' + a run name (a run may be called
// "auto" or "none").
const AUTO = 'auto';
const NONE = 'none';

export function choiceFromState(state) {
  if (state.refNone) return NONE;
  return state.ref ? `=${state.ref}` : AUTO;
}

function setChoice(state, value) {
  state.refNone = value === NONE;
  state.ref = value.startsWith('=') ? value.slice(1) : null;
}

// The picker's options: the previous run of this job (what the server found, or that there is
// none), none, then every other stored run, newest first (the order of /api/runs).
export function renderRefPicker(select, runs, current, ref) {
  const auto = ref.autoRun ? `previous run of this job: ${ref.autoRun}` : ref.autoChecked
    ? 'previous run of this job: none stored' : 'previous run of this job';
  const options = [[AUTO, auto], [NONE, 'none']];
  for (const r of runs) if (r.run !== current) options.push([`=${r.run}`, `${r.run} (${r.state ?? '?'})`]);
  const key = JSON.stringify(options);
  if (select.dataset.key !== key) {
    select.replaceChildren(...options.map(([value, text]) => {
      const opt = el('option', {}, text);
      opt.value = value;
      return opt;
    }));
    select.dataset.key = key;
  }
  select.value = choiceFromState(ref.state);
  if (select.value === '') select.value = AUTO; // a named run no longer stored
}

// The reference's median of one metric, from a band read: {steps, values}.
function medianLine(resp) {
  const band = resp.band || {};
  return { steps: Array.from(band.step || []), values: Array.from(band.median || []) };
}

// One compact line for a chart's head: the reference, and this run against it at the last
// step both have. `entry` is one metric of /api/run/compare, or null when the reference has
// no data for the metric.
export function compareText(metric, refRun, entry, hasData) {
  if (!hasData) return `ref: ${refRun} has no ${metric} data, nothing to overlay`;
  if (!entry) return `ref: ${refRun}`;
  const last = entry.last;
  if (!last) {
    const span = entry.ref_last_step === null || entry.ref_last_step === undefined
      ? '' : ` (ref's last step ${entry.ref_last_step})`;
    return `ref: ${refRun} · no step in common with this run yet${span}`;
  }
  const pct = last.ratio === null || last.ratio === undefined || !Number.isFinite(last.ratio)
    ? '' : ` (${last.ratio >= 1 ? '+' : ''}${((last.ratio - 1) * 100).toFixed(1)}%)`;
  return `ref: ${refRun} · step ${last.step}: this run ${fmt(last.run)}${pct}, ref ${fmt(last.ref)}`;
}

// ctx: {state, charts, showError, scheduleRedraw, picker (the select)}
export function refView(ctx) {
  const { state, charts } = ctx;
  const ref = {
    state,
    run: null, // the reference in use, or null
    autoRun: null, // what "previous run of this job" is for the current run
    autoChecked: false,
    lines: new Map(), // metric -> {steps, values}; absent: the reference has no such metric
    refMetrics: null, // Set of the reference's metrics, once known
    compare: new Map(), // metric -> /api/run/compare entry
    token: 0, // a newer choice makes older reads land nowhere
  };

  function apply(chart) {
    if (!ref.run) {
      chart.setRef(null);
      return;
    }
    const known = ref.refMetrics !== null;
    const has = !known || ref.refMetrics.has(chart.metric);
    chart.setRef({
      run: ref.run,
      line: ref.lines.get(chart.metric) || null,
      text: known ? compareText(chart.metric, ref.run, ref.compare.get(chart.metric), has) : `ref: ${ref.run}`,
      missing: known && !has,
    });
  }

  function applyAll() {
    for (const c of charts.values()) apply(c);
    ctx.scheduleRedraw();
  }

  async function readCompare(token) {
    const params = ref.state.refNone ? null : ref.state.ref ? { ref: ref.state.ref } : {};
    if (!params || !state.run) return null;
    try {
      // ref null in the answer: no earlier run of this job; the picker says so.
      return await api(runPath(state.run, 'compare'), params);
    } catch (err) {
      if (token !== ref.token) return null; // an answer for a run no longer shown
      throw err;
    }
  }

  async function readLine(token, metric) {
    if (!ref.run || !ref.refMetrics.has(metric) || ref.lines.has(metric)) return;
    // view=band: the median whatever the reference's rank count; no rank lines wanted
    const resp = await api(runPath(ref.run, 'series'), {
      metric, view: 'band', max_points: REF_MAX_POINTS, format: 'bin', minmax: false,
    });
    if (token !== ref.token || resp.run !== ref.run) return;
    ref.lines.set(metric, medianLine(resp));
  }

  function takeCompare(resp) {
    ref.compare = new Map((resp.metrics || []).map((m) => [m.metric, m]));
    ref.refMetrics = new Set([...(resp.metrics || []).map((m) => m.metric), ...(resp.only_in_ref || [])]);
  }

  // A new run or a new choice: forget the old reference, read the new one.
  async function load() {
    ref.token += 1;
    const token = ref.token;
    if (state.ref === state.run) state.ref = null; // a run is no reference for itself
    Object.assign(ref, { run: null, lines: new Map(), refMetrics: null, compare: new Map() });
    if (!ref.state.ref) Object.assign(ref, { autoRun: null, autoChecked: false });
    applyAll();
    renderPicker();
    const resp = await readCompare(token);
    if (token !== ref.token) return;
    if (!ref.state.ref && !ref.state.refNone) Object.assign(ref, { autoRun: resp ? resp.ref : null, autoChecked: true });
    renderPicker();
    if (!resp || !resp.ref) {
      applyAll();
      return;
    }
    ref.run = resp.ref;
    takeCompare(resp);
    await Promise.all([...charts.keys()].map((m) => readLine(token, m)));
    if (token === ref.token) applyAll();
  }

  // This run moved on (live points): the comparison follows, the reference's lines stay.
  const refresh = throttle(async () => {
    const token = ref.token;
    if (!ref.run) return;
    const resp = await readCompare(token).catch(ctx.showError);
    if (token !== ref.token || !resp || resp.ref !== ref.run) return;
    takeCompare(resp);
    await Promise.all([...charts.keys()].map((m) => readLine(token, m)));
    if (token === ref.token) applyAll();
  }, COMPARE_REFRESH_MS);

  function renderPicker() {
    renderRefPicker(ctx.picker, state.runs, state.run, ref);
  }

  ctx.picker.addEventListener('change', (e) => {
    setChoice(state, e.target.value);
    ctx.onChange();
    load().catch(ctx.showError);
  });

  return {
    ref,
    load,
    refresh,
    renderPicker,
    // A chart added after the reference was read (a metric that appeared later).
    attach(chart) {
      apply(chart);
      if (ref.run && ref.refMetrics) {
        const token = ref.token;
        readLine(token, chart.metric).then(() => { if (token === ref.token) apply(chart); }).catch(ctx.showError);
      }
    },
  };
}

export const REF_STYLE = { color: '#1e293b', width: 1.6, type: [6, 4], opacity: 0.85 };

// The reference's points over this run's steps [lo, hi] (one beyond each end, so the line
// reaches the edges): a longer reference must not stretch this run's axes.
export function clipToSteps(line, lo, hi) {
  const steps = [];
  const values = [];
  if (!line || !Number.isFinite(lo) || !Number.isFinite(hi)) return { steps, values };
  let a = 0;
  while (a < line.steps.length && line.steps[a] < lo) a += 1;
  let b = a;
  while (b < line.steps.length && line.steps[b] <= hi) b += 1;
  for (let i = Math.max(0, a - 1); i < Math.min(line.steps.length, b + 1); i++) {
    steps.push(line.steps[i]);
    values.push(line.values[i]);
  }
  return { steps, values };
}

// The reference's value for a tooltip at `step`: the last reference step at or before it
// (its line is downsampled, so its steps need not be this run's), or null.
export function refAt(line, step) {
  if (!line || !line.steps.length || step < line.steps[0]) return null;
  let lo = 0;
  let hi = line.steps.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (line.steps[mid] <= step) lo = mid;
    else hi = mid - 1;
  }
  return { step: line.steps[lo], value: line.values[lo] };
}
