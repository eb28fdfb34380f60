// Compare view: one metric of several runs overlaid on a shared step axis, and the config fields in which
// the runs differ (GET /api/runs/compare).
import { api, configText, el, fmtNum, pageData } from "./api.js";
import { STEP_INCRS, yAxisSize } from "./charts.js";

const data = pageData("page-data");
const PALETTE = ["#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#1098ad", "#f08c00", "#c2255c", "#5c7cfa",
  "#495057", "#66a80f", "#e8590c", "#0b7285"];
const $ = (id) => document.getElementById(id);
let plot = null;

const runSelect = $("compare-runs");
const chosen = new Set(data.runs.map((r) => r.id));
const byId = new Map([...data.candidates, ...data.runs].map((r) => [r.id, r]));
for (const r of byId.values()) {
  runSelect.append(el("option", { value: r.id, selected: chosen.has(r.id) }, `${r.label} (${r.state})`));
}

/** Union of the metric keys the chosen runs reported. */
async function loadKeys(runIds) {
  const keys = new Set();
  for (const id of runIds) {
    try { for (const k of (await api(`/api/runs/${id}/metrics/keys`)).keys) keys.add(k); } catch { /* skip */ }
  }
  const select = $("compare-key");
  const want = select.value || data.key;
  const sorted = [...keys].sort();
  select.replaceChildren(...sorted.map((k) => el("option", { value: k, selected: k === want }, k)));
  if (!sorted.includes(want) && sorted.length) select.value = sorted.includes("reward/mean") ? "reward/mean" : sorted[0];
}

/**
 * Align series on the union of their steps (uPlot wants one x array); a run without a point at a step
 * gets null there and its line spans the gap.
 */
export function alignSeries(seriesList) {
  const steps = [...new Set(seriesList.flatMap((s) => s.steps))].sort((a, b) => a - b);
  const index = new Map(steps.map((s, i) => [s, i]));
  const columns = seriesList.map((s) => {
    const col = new Array(steps.length).fill(null);
    s.steps.forEach((st, i) => { col[index.get(st)] = s.values[i]; });
    return col;
  });
  return [steps, ...columns];
}


/** One run's cell of a difference: its value, or "(absent)" where its config lacks the field (not null);
 * a value too long to show is the start of its JSON text (the answer cut it). */
function diffCell(difference, runId) {
  if (difference.absent.includes(runId)) {
    return el("td", { class: "muted", title: "this run's config has no such field" }, "(absent)");
  }
  const value = difference.values[String(runId)];
  if ((difference.cut || []).includes(runId)) {
    return el("td", { class: "mono", title: "too long to show in full: its start" }, value);
  }
  return el("td", { class: "mono" }, configText(value));
}

let diffToken = 0;

/** The "Config differences" table: one row per differing field path, one column per run. */
async function loadDiff(ids) {
  const token = ++diffToken;
  const note = $("diff-note");
  const clear = () => { $("diff-head").replaceChildren(); $("diff-rows").replaceChildren(); $("diff-basis").replaceChildren(); };
  if (ids.length < 2) {
    clear();
    note.textContent = "Pick two runs or more to see how their configs differ.";
    return;
  }
  note.textContent = "loading…";
  let answer;
  try {
    answer = await api("/api/runs/compare", { params: { ids: ids.join(",") } });
  } catch (err) {
    if (token !== diffToken) return;
    clear();
    note.textContent = `could not compare the configs: ${err.message}`;
    return;
  }
  if (token !== diffToken) return;  // a later choice of runs is on its way
  clear();
  $("diff-head").append(el("tr", {}, el("th", {}, "field"), answer.runs.map((r, i) =>
    el("th", { style: `border-bottom: 3px solid ${PALETTE[i % PALETTE.length]}` }, r.label))));
  $("diff-rows").append(...answer.differences.map((d) => el("tr", { dataset: { path: d.path } },
    el("td", {}, el("code", {}, d.path)), answer.runs.map((r) => diffCell(d, r.id)))));
  const n = answer.total_differences ?? answer.differences.length;
  const shown = answer.differences.length < n ? ` (the first ${answer.differences.length} shown)` : "";
  note.textContent = n ? `${n} field${n === 1 ? " differs" : "s differ"}${shown}` : "The runs' configs are identical.";
  $("diff-basis").append(...answer.runs.filter((r) => r.config_basis !== "validated").map((r) =>
    el("li", {}, `${r.label}: compared as stored (it no longer parses: ${r.config_problem})`)));
}

async function draw() {
  const ids = [...runSelect.selectedOptions].map((o) => Number(o.value)).slice(0, data.max_runs);
  const key = $("compare-key").value;
  $("compare-title").textContent = key || "–";
  const url = new URL(window.location.href);
  url.searchParams.set("runs", ids.join(","));
  if (key) url.searchParams.set("key", key);
  window.history.replaceState(null, "", url);
  loadDiff(ids);
  if (!ids.length || !key) {
    $("compare-note").textContent = "Pick runs and a metric.";
    return;
  }
  const series = [];
  for (const id of ids) {
    try {
      const answer = await api(`/api/runs/${id}/metrics`, { params: { keys: key, max_points: 2000 } });
      const s = answer.series[0] || { steps: [], values: [] };
      series.push({ id, steps: s.steps, values: s.values });
    } catch (err) {
      series.push({ id, steps: [], values: [], error: err.message });
    }
  }
  const aligned = alignSeries(series);
  const opts = {
    width: Math.max($("compare-chart").clientWidth, 300),
    height: 380,
    scales: { x: { time: false } },
    legend: { show: true },
    series: [{ label: "step" }, ...series.map((s, i) => ({
      label: byId.get(s.id) ? byId.get(s.id).label : `run ${s.id}`,
      stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true,
    }))],
    axes: [{ stroke: "#667085", grid: { stroke: "#eef0f3" }, incrs: STEP_INCRS },
      { size: yAxisSize, stroke: "#667085", grid: { stroke: "#eef0f3" }, values: (_u, vals) => vals.map(fmtNum) }],
  };
  if (plot) plot.destroy();
  $("compare-chart").replaceChildren();
  plot = new uPlot(opts, aligned, $("compare-chart"));
  const empty = series.filter((s) => !s.steps.length).map((s) => (byId.get(s.id) || { label: s.id }).label);
  $("compare-note").textContent = empty.length ? `no ${key} yet: ${empty.join(", ")}` : "";
}

runSelect.addEventListener("change", async () => {
  await loadKeys([...runSelect.selectedOptions].map((o) => Number(o.value)));
});
$("compare-form").addEventListener("submit", (ev) => { ev.preventDefault(); draw(); });
window.addEventListener("resize", () => { if (plot) plot.setSize({ width: $("compare-chart").clientWidth, height: 380 }); });

(async () => {
  await loadKeys([...chosen]);
  if (chosen.size) await draw();
  else loadDiff([]);
})();
