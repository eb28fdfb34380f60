// Experiment page: the Launch button posts to the API and opens the new run's dashboard; while a run is
// active its row's state and times follow the API (every 3 s).
import { api, fmtTime, pageData, results } from "./api.js";
import { badgeRunsWithAlerts } from "./run_alerts.js"; // alerts

const btn = document.getElementById("launch-btn");
const errorBox = document.getElementById("action-error");

if (btn) {
  btn.addEventListener("click", async () => {
    btn.disabled = true;
    errorBox.hidden = true;
    try {
      const run = await api("/api/runs", { method: "POST", body: { experiment: Number(btn.dataset.experiment) } });
      window.location.href = `/runs/${run.id}/`;
    } catch (err) {
      const fields = Object.entries(err.fieldErrors || {}).map(([k, v]) => `${k}: ${v.join(" ")}`);
      errorBox.textContent = fields.length ? `Cannot launch: ${fields.join("; ")}` : `Cannot launch: ${err.message}`;
      errorBox.hidden = false;
      btn.disabled = false;
    }
  });
}

const ACTIVE = new Set(pageData("page-data").active_states);
const table = document.querySelector("[data-testid=runs]");

function activeRows() {
  return [...document.querySelectorAll("tr[data-run-id]")].filter((tr) =>
    ACTIVE.has(tr.querySelector("[data-field=state]").textContent.trim()));
}

async function refreshStates() {
  if (!table || !activeRows().length) return;
  try {
    const runs = results(await api("/api/runs", { params: { experiment: table.dataset.experiment, limit: 100 } }));
    for (const run of runs) {
      const tr = document.querySelector(`tr[data-run-id="${run.id}"]`);
      if (!tr) continue;
      const badge = tr.querySelector("[data-field=state]");
      badge.textContent = run.state;
      badge.className = `badge ${run.state}`;
      tr.querySelector("[data-field=started_at]").textContent = run.started_at ? fmtTime(run.started_at) : "–";
      tr.querySelector("[data-field=finished_at]").textContent = run.finished_at ? fmtTime(run.finished_at) : "–";
    }
  } catch { /* try again on the next tick */ }
  if (activeRows().length) setTimeout(refreshStates, 3000);
}
setTimeout(refreshStates, 3000);

// --- alerts: a badge on each run with open alerts ---
badgeRunsWithAlerts([...document.querySelectorAll("tr[data-run-id]")],
  table ? { project: table.dataset.project } : {});
