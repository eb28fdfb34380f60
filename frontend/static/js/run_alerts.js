// Alerts of runs (docs/dashboard.md, "Alerts"): the run page's banner of the run's open alerts
// (GET /api/alerts, then the live stream's "alert" messages), and a badge per run in a run list.
// Messages are written as text, never as HTML: an engine alert's text comes from the run.

import { api, el, fmtTime, results } from "./api.js";

const LABELS = { engine: "Engine alert", run_failed: "Run failed", rule: "Metric rule" };

export class AlertBanner {
  constructor(box, runId, canResolve) {
    this.box = box;
    this.runId = runId;
    this.canResolve = canResolve;
    this.open = new Map(); // id -> alert
  }

  async load() {
    try {
      const page = await api("/api/alerts", { params: { run: this.runId, open: 1, limit: 100 } });
      this.open = new Map(results(page).map((a) => [a.id, a]));
    } catch { /* keep what is shown; the live stream still updates it */ }
    this.render();
  }

  /** A live "alert" message: opened, repeated or resolved. */
  apply(alert) {
    if (alert.resolved_at) this.open.delete(alert.id);
    else this.open.set(alert.id, { ...(this.open.get(alert.id) || {}), ...alert });
    this.render();
  }

  async resolve(id, button) {
    button.disabled = true;
    try {
      this.apply(await api(`/api/alerts/${id}/resolve`, { method: "POST" }));
    } catch {
      button.disabled = false;
    }
  }

  render() {
    const rows = [...this.open.values()].sort((a, b) => (a.last_seen < b.last_seen ? 1 : -1)).map((a) => {
      const resolve = this.canResolve
        ? el("button", { class: "btn small", type: "button", "data-testid": "resolve-alert" }, "Resolve")
        : null;
      if (resolve) resolve.addEventListener("click", () => this.resolve(a.id, resolve));
      return el("div", { class: "alert warn spread", role: "alert", "data-testid": "run-alert",
                         "data-alert-id": a.id, "data-kind": a.kind, "data-count": a.count },
        el("span", {}, el("b", {}, LABELS[a.kind] || a.kind), ": ", a.message,
          el("span", { class: "small muted" }, ` (${a.count > 1 ? `${a.count}×, ` : ""}last ${fmtTime(a.last_seen)})`)),
        resolve);
    });
    this.box.replaceChildren(...rows);
    this.box.hidden = rows.length === 0;
  }
}

/** Badge each row `tr[data-run-id]` with its run's number of open alerts (one request for the list). */
export async function badgeRunsWithAlerts(rows, params = {}) {
  if (!rows.length) return;
  let open;
  try {
    open = results(await api("/api/alerts", { params: { ...params, open: 1, limit: 500 } }));
  } catch { return; }
  const counts = new Map();
  for (const a of open) counts.set(a.run, (counts.get(a.run) || 0) + 1);
  for (const tr of rows) {
    tr.querySelector("[data-testid=run-alerts-badge]")?.remove();
    const n = counts.get(Number(tr.dataset.runId));
    if (!n) continue;
    const cell = tr.querySelector("[data-field=state]").parentElement;
    cell.append(" ", el("span", { class: "badge alerting", "data-testid": "run-alerts-badge",
                                  title: "open alerts" }, `⚠ ${n}`));
  }
}
