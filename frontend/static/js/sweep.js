// Sweep page: its runs ranked by the sweep's metric (last or best value; any column sorts), and a scatter
// of one searched parameter against the metric (uPlot). Live: the API is polled every 3 s while the
// sweep has unfinished runs (GET /api/sweeps/{id}).
import { api, configText, el, fmtNum, pageData } from "./api.js";
import { yAxisSize } from "./charts.js";
import { scatterData, sortRows } from "./sweep_view.js";

const data = pageData("page-data");
const $ = (id) => document.getElementById(id);
const LIVE = new Set(["queued", "running", "cancelling"]);
const POLL_MS = 3000;
let sweep = null;
let sort = { key: "rank", dir: 1 };
let plot = null;

function header() {
  const cols = [["rank", "rank"], ["number", "run"], ["state", "state"],
    ...sweep.params.map((p) => [`param:${p}`, p]), ["seed", "seed"], ["last", "last"], ["best", "best"]];
  $("sweep-head").replaceChildren(el("tr", {}, cols.map(([key, label]) => {
    const arrow = sort.key === key ? (sort.dir > 0 ? " ▲" : " ▼") : "";
    const th = el("th", { class: "sortable", dataset: { sort: key }, title: "sort" }, label + arrow);
    th.style.cursor = "pointer";
    th.addEventListener("click", () => {
      sort = { key, dir: sort.key === key ? -sort.dir : (key === "rank" || key === "number" ? 1 : -1) };
      render();
    });
    return th;
  })));
}

function row(r) {
  const state = el("td", {}, el("span", { class: `badge ${r.state}`, dataset: { field: "state" } }, r.state));
  if (r.early_stopped_at) {
    state.append(" ", el("span", { class: "badge alerting", title: r.early_stop_reason }, "early-stopped"));
  }
  const last = r.last === null ? "–" : `${fmtNum(r.last)} @${r.last_step}`;
  return el("tr", { dataset: { runId: r.id, rank: r.rank ?? "" } },
    el("td", { dataset: { field: "rank" } }, r.rank ?? "–"),
    el("td", {}, el("a", { href: `/runs/${r.id}/` }, `#${r.number}`)),
    state,
    sweep.params.map((p) => el("td", { class: "mono" }, configText(r.params[p]))),
    el("td", { class: "mono" }, String(r.seed)),
    el("td", { dataset: { field: "last" } }, last),
    el("td", { dataset: { field: "best" } }, r.best === null ? "–" : fmtNum(r.best)));
}

/** The x range with a margin, so that the points at its ends are drawn whole. */
function padded(lo, hi, log) {
  if (lo === null || hi === null) return [0, 1];
  if (log) {
    const f = lo === hi ? 2 : (hi / lo) ** 0.05;
    return [lo / f, hi * f];
  }
  const pad = lo === hi ? Math.abs(lo) * 0.1 || 1 : (hi - lo) * 0.05;
  return [lo - pad, hi + pad];
}

function chart() {
  const param = $("sweep-param").value;
  if (!param) return;
  const { xs, ys, labels, n } = scatterData(sweep.runs, param);
  $("sweep-chart-note").textContent = n ? `${n} of ${sweep.runs.length} runs have a ${sweep.metric} value`
    : `no run has a ${sweep.metric} value yet`;
  const positive = labels === null && xs.length > 1 && xs[0] > 0;
  const logX = positive && xs[xs.length - 1] / xs[0] >= 20;
  const opts = {
    width: Math.max($("sweep-chart").clientWidth, 300),
    height: 320,
    scales: { x: { time: false, distr: logX ? 3 : 1, range: (_u, lo, hi) => padded(lo, hi, logX) } },
    legend: { show: false },
    cursor: { drag: { x: false, y: false } },
    series: [{ label: param }, { label: `${sweep.ranked_by} ${sweep.metric}`, stroke: "#2f6fde",
      paths: () => null, points: { show: true, size: 9, fill: "#2f6fde" } }],
    axes: [{ stroke: "#667085", grid: { stroke: "#eef0f3" }, label: param,
      values: (_u, vals) => vals.map((v) => (labels ? (labels[v] ?? "") : fmtNum(v))),
      ...(labels ? { incrs: [1] } : {}) },
    { size: yAxisSize, stroke: "#667085", grid: { stroke: "#eef0f3" }, values: (_u, vals) => vals.map(fmtNum) }],
  };
  if (plot) plot.destroy();
  $("sweep-chart").replaceChildren();
  plot = new uPlot(opts, [xs, ys], $("sweep-chart"));
}

function render() {
  const badge = $("sweep-state");
  badge.textContent = sweep.state;
  badge.className = `badge ${sweep.state === "finished" ? "succeeded" : sweep.state}`;
  const counts = Object.entries(sweep.run_states).map(([s, n]) => `${n} ${s}`).join(", ");
  const stopped = sweep.early_stopped ? `; ${sweep.early_stopped} early-stopped` : "";
  $("sweep-note").textContent = `${counts}${stopped}`;
  const cancel = $("sweep-cancel");
  if (cancel) cancel.hidden = !LIVE.has(sweep.state) || sweep.state === "cancelling";
  header();
  $("sweep-rows").replaceChildren(...sortRows(sweep.runs, sort.key, sort.dir).map(row));
  const select = $("sweep-param");
  if (!select.options.length) {
    select.replaceChildren(...sweep.params.map((p) => el("option", { value: p }, p)));
  }
  chart();
}

async function load() {
  try {
    sweep = await api(`/api/sweeps/${data.sweep_id}`, { params: { summary: $("sweep-summary-select").value } });
    $("sweep-error").hidden = true;
    render();
  } catch (err) {
    $("sweep-error").textContent = `Cannot load the sweep: ${err.message}`;
    $("sweep-error").hidden = false;
  }
}

async function poll() {
  await load();
  if (!sweep || LIVE.has(sweep.state)) setTimeout(poll, POLL_MS);
}

$("sweep-summary-select").addEventListener("change", load);
$("sweep-param").addEventListener("change", chart);
window.addEventListener("resize", () => { if (plot) plot.setSize({ width: $("sweep-chart").clientWidth, height: 320 }); });
const cancelBtn = $("sweep-cancel");
if (cancelBtn) {
  cancelBtn.addEventListener("click", async () => {
    if (!window.confirm("Cancel every unfinished run of this sweep?")) return;
    cancelBtn.disabled = true;
    try {
      sweep = await api(`/api/sweeps/${data.sweep_id}/cancel`, { method: "POST" });
      render();
      setTimeout(poll, POLL_MS);
    } catch (err) {
      $("sweep-error").textContent = `Cannot cancel: ${err.message}`;
      $("sweep-error").hidden = false;
    }
    cancelBtn.disabled = false;
  });
}
(async () => {
  // The sweep's own summary is the first ranking shown.
  $("sweep-summary-select").value = data.summary;
  await poll();
})();
