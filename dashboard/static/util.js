// Small helpers shared by the page's modules. Everything from the wire is text: the page
// builds DOM with textContent, and the one place HTML is made (ECharts tooltips) goes
// through esc().

const NONFINITE = { NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity };

// A number from the API: NaN and ±Inf travel as the strings "NaN", "Infinity", "-Infinity"
// (the JSONL convention); null stays null (no value).
export function num(x) {
  if (typeof x === 'number') return x;
  if (x === null || x === undefined) return null;
  if (Object.hasOwn(NONFINITE, x)) return NONFINITE[x];
  const v = Number(x);
  return Number.isNaN(v) ? null : v;
}

export function esc(text) {
  return echarts.format.encodeHTML(String(text));
}

export function fmt(v) {
  if (v === null || v === undefined) return '–';
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
  return String(Number(v.toPrecision(5)));
}

export function fmtZ(z) {
  if (z === null || z === undefined) return '–';
  if (!Number.isFinite(z)) return fmt(z);
  return (z >= 0 ? '+' : '') + z.toFixed(1);
}

export function ago(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '–';
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

// "0,3,8-11" <-> Set of ints: how selected ranks travel in the URL and the API.
export function parseRanks(text) {
  const out = new Set();
  for (const part of String(text || '').split(',')) {
    const m = part.trim().match(/^(\d+)(?:-(\d+))?$/);
    if (!m) continue;
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    for (let r = lo; r <= hi && r - lo < 4096; r++) out.add(r);
  }
  return out;
}

// A typed selection, checked: {ranks, errors}. Each error names the part that was wrong, so
// "foo, 99" on a 4-rank run says so rather than silently selecting 99 or nothing.
export function checkRanks(text, known) {
  const ranks = new Set();
  const errors = [];
  const have = known && known.size ? known : null;
  const span = have ? `${Math.min(...have)}–${Math.max(...have)}` : '';
  for (const raw of String(text || '').split(',')) {
    const part = raw.trim();
    if (!part) continue;
    const m = part.match(/^(\d+)(?:\s*-\s*(\d+))?$/);
    if (!m) {
      errors.push(`"${part.slice(0, 20)}" is not a rank or a range like 8-11`);
      continue;
    }
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo || hi - lo >= 4096) {
      errors.push(`"${part.slice(0, 20)}" is not a valid range`);
      continue;
    }
    const missing = [];
    for (let r = lo; r <= hi; r++) {
      if (have && !have.has(r)) missing.push(r);
      else ranks.add(r);
    }
    if (missing.length) {
      const which = missing.length === 1 ? `rank ${missing[0]}` : `ranks ${formatRanks(new Set(missing))}`;
      errors.push(`${which} not in this run (ranks ${span})`);
    }
  }
  return { ranks, errors };
}

export function formatRanks(set) {
  const sorted = [...set].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    parts.push(j > i ? `${sorted[i]}-${sorted[j]}` : String(sorted[i]));
    i = j + 1;
  }
  return parts.join(',');
}

// A rank table after a stream delta: the changed ranks' entries replace theirs (or join),
// the removed ranks leave; the table stays in rank order.
export function mergeRanks(table, changed, removed) {
  const byRank = new Map(table.map((r) => [r.rank, r]));
  for (const rank of removed) byRank.delete(rank);
  for (const r of changed) byRank.set(r.rank, r);
  return [...byRank.values()].sort((a, b) => a.rank - b.rank);
}

export function median(sorted) {
  const n = sorted.length;
  if (!n) return NaN;
  const mid = n >> 1;
  return n % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

export function quantile(sorted, q) {
  if (!sorted.length) return NaN;
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

// Index of the first element >= x in a sorted array.
export function lowerBound(arr, x) {
  let lo = 0;
  let hi = arr.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export class ApiError extends Error {}

export async function api(path, params = {}) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== '') url.searchParams.set(k, String(v));
  }
  const res = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  if (!res.ok) {
    let detail = res.statusText;
    try {
      const body = await res.json();
      detail = typeof body.detail === 'string' ? body.detail : JSON.stringify(body.detail);
    } catch (_) { /* not JSON: keep the status text */ }
    throw new ApiError(`${res.status} ${detail}`);
  }
  const type = res.headers.get('Content-Type') || '';
  if (type.startsWith('application/octet-stream')) return decodeSeries(await res.arrayBuffer());
  return res.json();
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

// The series route's binary body (`format=bin`, layout in dashboard/seriesfmt.py) in the shape
// of its JSON: every column a Float64Array (views into the body), NaN and ±Inf as numbers.
export function decodeSeries(buf) {
  const view = new DataView(buf);
  if (buf.byteLength < 8 || String.fromCharCode(...new Uint8Array(buf, 0, 4)) !== 'RWS1') {
    throw new ApiError('not a rankwatch series body');
  }
  const size = view.getUint32(4, true);
  const resp = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, size)));
  const cols = {};
  let at = 8 + size;
  for (const [name, n] of resp.columns) {
    if (LITTLE_ENDIAN) cols[name] = new Float64Array(buf, at, n);
    else cols[name] = Float64Array.from({ length: n }, (_, i) => view.getFloat64(at + 8 * i, true));
    at += 8 * n;
  }
  const series = {};
  let first = 0;
  resp.series.ranks.forEach((rank, i) => {
    const end = first + resp.series.counts[i];
    series[rank] = {};
    for (const f of ['step', 'value', 'min', 'max']) {
      const col = cols[`series.${f}`];
      if (col) series[rank][f] = col.subarray(first, end); // min/max: unless minmax=false
    }
    first = end;
  });
  resp.series = series;
  resp.band = {};
  for (const k of ['step', 'median', 'p5', 'p95', 'min', 'max']) resp.band[k] = cols[`band.${k}`];
  delete resp.columns;
  return resp;
}

// The query form of a run's routes: it serves every run name, '.' and '..' included
// (browsers drop such segments from a URL path).
export function runPath(run, tail) {
  return `/api/run/${tail}?run=${encodeURIComponent(run)}`;
}

// Calls fn at most once per `ms`, always with the latest arguments, trailing call included.
// What a read made stale resolves to (newestOnly).
export const STALE = Symbol('stale');

// ``read`` (an async function) whose answer is used only when no later call of it began in
// the meantime; an older one resolves to STALE. The page's reads are throttled, not queued:
// with a slow server (a large run, a busy head node) an older answer can land after a newer
// one, and applying it would put the page back in time until the next change.
export function newestOnly(read) {
  let started = 0;
  return async (...args) => {
    const mine = ++started;
    const out = await read(...args);
    return mine === started ? out : STALE;
  };
}

export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return function throttled() {
    const wait = last + ms - Date.now();
    if (wait <= 0 && !timer) {
      last = Date.now();
      fn();
    } else if (!timer) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, Math.max(0, wait));
    }
  };
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

export function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') node.className = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  if (text !== undefined) node.textContent = String(text);
  return node;
}
