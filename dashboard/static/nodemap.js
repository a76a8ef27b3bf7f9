// Ranks by node (GET /api/run/nodes): one tile per host, or per block of ranks when the ranks
// name no host, coloured by its worst rank. 12,500 nodes are one canvas, not 12,500 elements.
// Tiles whose worst rank is affected or worse get a ring as well: one bad node among
// thousands must be seen at a glance. Clicking a tile drills down to its ranks.
// A tile's max |z| is the z now of one metric (the answer's `metric`: the table's "z now"
// column's), while the incident card quotes the z of the step a divergence was first reported
// at, maybe of another metric: the readout, the legend and the tooltip say which it is.

import { el } from './util.js';

const TARGET_HEIGHT_PX = 300; // the tile size is chosen so the map is about this tall
const MIN_TILE_PX = 3;
const MAX_TILE_PX = 22;
const RING_FROM = 'affected'; // this level and worse are ringed

export const LEVEL_COLORS = {
  ok: '#d5dde6',
  far: '#8b98aa',
  stalled: '#f59e0b',
  affected: '#c2773a',
  flagged: '#b2182b',
  crashed: '#6b1010',
  culprit: '#e11d1d',
};

// A map of blocks of consecutive ranks comes without each tile's name, first and last rank and
// count (ranktable.compact_cells): they follow from its start, block size and rank count.
export function expand(resp) {
  if (resp.by !== 'block' || resp.name || !resp.cells) return resp;
  const n = resp.cells;
  const end = resp.start + resp.ranks - 1;
  const name = new Array(n);
  const first = new Array(n);
  const last = new Array(n);
  const count = new Array(n);
  for (let i = 0; i < n; i++) {
    first[i] = resp.start + i * resp.block;
    last[i] = Math.min(first[i] + resp.block - 1, end);
    count[i] = last[i] - first[i] + 1;
    name[i] = `ranks ${first[i]}–${last[i]}`;
  }
  return { ...resp, name, first, last, count };
}

export class NodeMap {
  constructor(canvas, legend, readout, onPick) {
    this.canvas = canvas;
    this.legend = legend;
    this.readout = readout;
    this.onPick = onPick;
    this.cells = null;
    this.picked = null;
    this.layout = { tile: 0, cols: 0 };
    canvas.addEventListener('click', (e) => {
      const i = this.hit(e);
      if (i !== null) this.pick(i);
    });
    canvas.addEventListener('mousemove', (e) => {
      const i = this.hit(e);
      this.canvas.style.cursor = i === null ? 'default' : 'pointer';
      this.describe(i ?? this.picked ?? this.worstIndex());
    });
    canvas.addEventListener('mouseleave', () => this.describe(this.picked ?? this.worstIndex()));
  }

  load(resp) {
    this.cells = expand(resp);
    this.levels = resp.levels;
    this.metric = String(resp.metric ?? '');
    const by = resp.by === 'host' ? 'node' : `block of ${resp.block} ranks`;
    this.canvas.title = `a tile per ${by}, coloured by its worst rank; max |z| now (${this.metric}): `
      + `its rank furthest from the others on ${this.metric} now, as the table's z now column`;
    if (this.picked !== null && this.picked >= resp.cells) this.picked = null;
    this.draw();
    this.renderLegend();
    this.describe(this.picked ?? this.worstIndex());
  }

  clear() {
    this.cells = null;
    this.picked = null;
    const ctx = this.canvas.getContext('2d');
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    this.legend.replaceChildren();
    this.readout.textContent = '';
  }

  cell(i) {
    const c = this.cells;
    return {
      index: i,
      name: c.name[i],
      host: c.by === 'host' ? c.name[i] : null,
      first: c.first[i],
      last: c.last[i],
      count: c.count[i],
      level: this.levels[c.level[i]],
      worst: c.worst[i],
      z: c.z[i],
    };
  }

  worstIndex() {
    const c = this.cells;
    if (!c || !c.cells) return null;
    let best = 0;
    for (let i = 1; i < c.cells; i++) if (c.level[i] > c.level[best]) best = i;
    return c.level[best] > 0 ? best : null;
  }

  draw() {
    const c = this.cells;
    if (!c) return;
    const width = Math.max(120, this.canvas.parentElement.clientWidth || 800);
    const n = Math.max(1, c.cells);
    let tile = Math.floor(Math.sqrt((width * TARGET_HEIGHT_PX) / n));
    tile = Math.max(MIN_TILE_PX, Math.min(MAX_TILE_PX, tile));
    const cols = Math.max(1, Math.floor(width / tile));
    const rows = Math.ceil(n / cols);
    const height = rows * tile + 2 * tile; // room for the rings of the last row
    this.layout = { tile, cols };
    const dpr = window.devicePixelRatio || 1;
    this.canvas.style.width = `${cols * tile}px`;
    this.canvas.style.height = `${height}px`;
    this.canvas.width = Math.round(cols * tile * dpr);
    this.canvas.height = Math.round(height * dpr);
    const ctx = this.canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cols * tile, height);
    const gap = tile >= 5 ? 1 : 0;
    const colors = this.levels.map((name) => LEVEL_COLORS[name] || '#000');
    const ringFrom = this.levels.indexOf(RING_FROM);
    const rings = [];
    for (let i = 0; i < n; i++) {
      const lv = c.level[i];
      ctx.fillStyle = colors[lv];
      const x = (i % cols) * tile;
      const y = Math.floor(i / cols) * tile + tile;
      ctx.fillRect(x, y, tile - gap, tile - gap);
      if (lv >= ringFrom) rings.push(i);
    }
    // the worst last, so a culprit's ring is never under an affected one
    rings.sort((a, b) => c.level[a] - c.level[b]);
    for (const i of [...rings, ...(this.picked === null ? [] : [this.picked])]) {
      const x = (i % cols) * tile + tile / 2;
      const y = Math.floor(i / cols) * tile + tile + tile / 2;
      ctx.beginPath();
      ctx.arc(x, y, Math.max(5, tile * 1.2), 0, 2 * Math.PI);
      ctx.lineWidth = 2;
      ctx.strokeStyle = i === this.picked ? '#1f77b4' : colors[c.level[i]];
      ctx.stroke();
    }
  }

  hit(e) {
    const c = this.cells;
    if (!c) return null;
    const box = this.canvas.getBoundingClientRect();
    const { tile, cols } = this.layout;
    const col = Math.floor((e.clientX - box.left) / tile);
    const row = Math.floor((e.clientY - box.top - tile) / tile);
    if (col < 0 || col >= cols || row < 0) return null;
    const i = row * cols + col;
    return i < c.cells ? i : null;
  }

  // The pixel centre of a cell (tests click it as a person would).
  centre(i) {
    const { tile, cols } = this.layout;
    return [(i % cols) * tile + tile / 2, Math.floor(i / cols) * tile + tile + tile / 2];
  }

  indexOf(name) {
    return this.cells ? this.cells.name.indexOf(name) : -1;
  }

  pick(i) {
    this.picked = i;
    this.draw();
    this.describe(i);
    if (i !== null) this.onPick(this.cell(i));
  }

  unpick() {
    this.picked = null;
    this.draw();
    this.describe(this.worstIndex());
  }

  describe(i) {
    if (!this.cells || i === null || i === undefined) {
      this.readout.textContent = this.cells ? 'every node ok · click a tile for its ranks' : '';
      return;
    }
    const cell = this.cell(i);
    const span = cell.first === cell.last ? `rank ${cell.first}` : `ranks ${cell.first}–${cell.last}`;
    const z = cell.z === null ? '' : ` · max |z| now (${this.metric}) ${cell.z.toFixed(1)}`;
    const worst = cell.level === 'ok' ? 'every rank ok' : `worst: rank ${cell.worst} ${cell.level}`;
    const lead = i === this.picked ? 'shown in the table: ' : i === this.worstIndex() ? 'worst node: ' : '';
    this.readout.textContent = `${lead}${cell.host ?? cell.name} · ${cell.count} ${cell.count === 1 ? 'rank' : 'ranks'}${cell.host ? ` (${span})` : ''} · ${worst}${z}`;
  }

  renderLegend() {
    const c = this.cells;
    const counts = new Map();
    for (let i = 0; i < c.cells; i++) counts.set(c.level[i], (counts.get(c.level[i]) || 0) + 1);
    const items = [...counts.entries()].sort(([a], [b]) => b - a).map(([lv, count]) => {
      const name = this.levels[lv];
      const item = el('span', { class: 'nodemap-key' });
      const swatch = el('span', { class: 'nodemap-swatch' });
      swatch.style.background = LEVEL_COLORS[name];
      item.append(swatch, `${name} ${count.toLocaleString('en-US')}`);
      return item;
    });
    items.push(el('span', { class: 'nodemap-key nodemap-metric' }, `max |z| now (${this.metric}) in the line below`));
    this.legend.replaceChildren(...items);
  }
}
