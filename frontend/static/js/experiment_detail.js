// Experiment page: the Launch button posts to the API and opens the new run's dashboard.
import { api } from "./api.js";

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
