// What a set of MetricCharts (charts.js) asks of the section that holds it, answered the same
// way by the training charts (app.js) and the hardware charts (hardware.js): the ranks flagged
// on any metric, and the span of the x axis the charts cover together.

// divergent: metric -> Set of ranks flagged on it.
export function flaggedRanks(divergent) {
  const out = new Set();
  for (const ranks of divergent.values()) for (const r of ranks) out.add(r);
  return out;
}

// One unit wide at least, so a single step (or sample) still makes an axis.
export function spanOf(charts) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const c of charts.values()) {
    const [a, b] = c.stepExtent();
    lo = Math.min(lo, a);
    hi = Math.max(hi, b);
  }
  return hi === lo ? [lo, hi + 1] : [lo, hi];
}
