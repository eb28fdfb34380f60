// Metric charts on uPlot (vendored, global `uPlot`): one small chart per metric key, grouped by the key's
// namespace (reward/, actor/, async/, timing/ …). History comes from the REST API (downsampled on the
// server), live points are merged in by step (a step already drawn is not drawn twice).

import { el, fmtNum } from "./api.js";

/** Namespaces in the order an RL engineer reads them; the rest follow alphabetically. */
const GROUP_ORDER = ["reward", "val", "actor", "async", "timing", "throughput", "response_length", "off_policy",
  "trainer", "rollouter"];
/** Headings that say more than the namespace. */
const GROUP_TITLE = { val: "val/ — held-out evaluation" };
const PALETTE = ["#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#1098ad", "#f08c00", "#c2255c", "#5c7cfa",
  "#495057", "#66a80f", "#e8590c", "#0b7285"];

export const namespaceOf = (key) => (key.includes("/") ? key.split("/")[0] : "other");

function groupRank(ns) {
  const i = GROUP_ORDER.indexOf(ns);
  return i === -1 ? GROUP_ORDER.length : i;
}

/** Insert (step, value) into sorted parallel arrays; false when that step is already there. */
export function mergePoint(xs, ys, step, value) {
  const n = xs.length;
  if (n === 0 || step > xs[n - 1]) {
    xs.push(step);
    ys.push(value);
    return true;
  }
  let lo = 0;
  let hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < step) lo = mid + 1; else hi = mid;
  }
  if (xs[lo] === step) return false;
  xs.splice(lo, 0, step);
  ys.splice(lo, 0, value);
  return true;
}

// Steps are integers: never put a tick at 2.5.
const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000,
  100000, 200000, 500000, 1000000];

/** Room for the longest tick label (exponent labels such as 8.75e-4 are wider than 0.25). */
export function yAxisSize(_u, values) {
  const longest = (values || []).reduce((m, v) => Math.max(m, String(v).length), 0);
  return Math.max(36, Math.ceil(longest * 6.6) + 18);
}

function axisValues(_u, vals) {
  return vals.map((v) => (v === null ? "" : fmtNum(v)));
}

/** One metric key: a titled box with a uPlot line chart of value over step. */
class MetricChart {
  constructor(key, color) {
    this.key = key;
    this.xs = [];
    this.ys = [];
    // The run's ancestors (what it was resumed or forked from), each up to the step the next one
    // started from: drawn dashed, so the run's curve reads as their continuation.
    this.pxs = [];
    this.pys = [];
    this.drawn = [[], [], []]; // the plot's aligned data (the cursor's index points into it)
    this.last = el("span", { class: "chart-last" });
    this.plotBox = el("div");
    this.node = el("div", { class: "chart", "data-metric": key },
      el("div", { class: "chart-title" }, el("span", {}, key), this.last), this.plotBox);
    this.color = color;
    this.plot = null;
    this.dirty = false;
  }

  mount(width) {
    this.plot = new uPlot({
      width: Math.max(width, 200),
      height: 170,
      legend: { show: false },
      // One cursor for all charts of the page: hovering a step shows it everywhere.
      cursor: { drag: { x: true, y: false }, sync: { key: "run-metrics" } },
      hooks: { setCursor: [(u) => this.showCursor(u.cursor.idx)] },
      scales: { x: { time: false } },
      series: [
        { label: "step" },
        { label: this.key, stroke: this.color, width: 1.5, fill: `${this.color}14`, spanGaps: true },
        { label: "earlier runs", stroke: "#98a2b3", width: 1.25, dash: [4, 3], spanGaps: true },
      ],
      axes: [
        { size: 28, stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#dfe3e8" }, incrs: STEP_INCRS },
        { size: yAxisSize, stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#dfe3e8" }, values: axisValues },
      ],
    }, this.drawn, this.plotBox);
  }

  /** Replace everything with a history query's answer. */
  setHistory(steps, values) {
    this.xs = [...steps];
    this.ys = [...values];
    this.dirty = true;
  }

  append(steps, values) {
    for (let i = 0; i < steps.length; i++) {
      if (mergePoint(this.xs, this.ys, steps[i], values[i])) this.dirty = true;
    }
  }

  /** Points of an ancestor run (already cut at the step its successor started from). */
  appendEarlier(steps, values) {
    for (let i = 0; i < steps.length; i++) {
      if (mergePoint(this.pxs, this.pys, steps[i], values[i])) this.dirty = true;
    }
  }

  /** The title's value: the hovered point while the cursor is on a chart, else the run's last point. */
  showCursor(idx) {
    const [xs, own, earlier] = this.drawn;
    if (idx === null || idx === undefined) {
      const i = this.ys.length - 1;
      this.last.textContent = i >= 0 ? `${fmtNum(this.ys[i])} @ ${this.xs[i]}` : "";
      return;
    }
    const v = own[idx] ?? earlier[idx];
    this.last.textContent = idx >= 0 && idx < xs.length && v !== null && v !== undefined ? `${fmtNum(v)} @ ${xs[idx]}` : "";
  }

  /** [steps, own values, earlier runs' values] on one step axis (null where a series has no point). */
  aligned() {
    if (!this.pxs.length) return [this.xs, this.ys, this.xs.map(() => null)];
    const byStep = new Map();
    this.pxs.forEach((x, i) => byStep.set(x, [null, this.pys[i]]));
    this.xs.forEach((x, i) => byStep.set(x, [this.ys[i], (byStep.get(x) || [null, null])[1]]));
    const steps = [...byStep.keys()].sort((a, b) => a - b);
    return [steps, steps.map((x) => byStep.get(x)[0]), steps.map((x) => byStep.get(x)[1])];
  }

  flush() {
    if (!this.dirty || !this.plot) return;
    this.dirty = false;
    this.drawn = this.aligned();
    this.plot.setData(this.drawn);
    this.showCursor(null);
    this.node.dataset.points = String(this.ys.length);
    this.node.dataset.earlierPoints = String(this.pys.length);
  }

  resize(width) {
    if (this.plot) this.plot.setSize({ width: Math.max(width, 200), height: 170 });
  }
}

/** All charts of a run, grouped by namespace; redraws at most once per animation frame. */
export class ChartBoard {
  constructor(root, emptyNote) {
    this.root = root;
    this.emptyNote = emptyNote;
    this.charts = new Map();
    this.groups = new Map();
    this.frame = null;
    this.observer = new ResizeObserver(() => this.resizeAll());
    this.observer.observe(root);
  }

  /** Plot width: the chart box's CSS width (fixed, or the page's width on a narrow screen) less padding. */
  chartWidth() {
    const probe = this.root.querySelector(".chart");
    return (probe ? probe.clientWidth : Math.min(this.root.clientWidth, 376)) - 14;
  }

  group(ns) {
    let g = this.groups.get(ns);
    if (g) return g;
    const grid = el("div", { class: "chart-grid" });
    const node = el("section", { class: "chart-group", "data-group": ns }, el("h3", {}, GROUP_TITLE[ns] || `${ns}/`), grid);
    g = { ns, node, grid };
    this.groups.set(ns, g);
    // Keep groups in reading order.
    const after = [...this.groups.values()]
      .filter((o) => o !== g && (groupRank(o.ns) > groupRank(ns) || (groupRank(o.ns) === groupRank(ns) && o.ns > ns)))
      .sort((a, b) => groupRank(a.ns) - groupRank(b.ns) || a.ns.localeCompare(b.ns))[0];
    if (after) this.root.insertBefore(node, after.node); else this.root.append(node);
    if (this.emptyNote) this.emptyNote.hidden = true;
    return g;
  }

  chart(key) {
    let c = this.charts.get(key);
    if (c) return c;
    const g = this.group(namespaceOf(key));
    c = new MetricChart(key, PALETTE[this.charts.size % PALETTE.length]);
    // Alphabetical inside a group.
    const next = [...g.grid.children].find((n) => n.dataset.metric > key);
    g.grid.insertBefore(c.node, next || null);
    this.charts.set(key, c);
    c.mount(this.chartWidth());
    return c;
  }

  setHistory(series) {
    for (const s of series) this.chart(s.key).setHistory(s.steps, s.values);
    this.schedule();
  }

  /** An ancestor run's history (a REST answer's series, cut at the step its successor started from). */
  setEarlier(series) {
    for (const s of series) this.chart(s.key).appendEarlier(s.steps, s.values);
    this.schedule();
  }

  /** Live payload: {key: {steps: [...], values: [...]}}. */
  append(series) {
    for (const [key, s] of Object.entries(series || {})) this.chart(key).append(s.steps, s.values);
    this.schedule();
  }

  schedule() {
    if (this.frame !== null) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      for (const c of this.charts.values()) c.flush();
    });
  }

  resizeAll() {
    const w = this.chartWidth();
    for (const c of this.charts.values()) c.resize(w);
  }

  /** Highest step seen in any series (for the progress line). */
  maxStep() {
    let m = null;
    for (const c of this.charts.values()) {
      if (c.xs.length) m = m === null ? c.xs[c.xs.length - 1] : Math.max(m, c.xs[c.xs.length - 1]);
    }
    return m;
  }
}

export { STEP_INCRS };
