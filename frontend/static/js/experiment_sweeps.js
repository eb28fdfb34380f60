// Experiment page (sweeps): the experiment's sweeps (links to their pages) and the "New sweep"
// form, which posts to /api/sweeps and opens the new sweep's page; refusals are listed by field path.
import { api, el, results } from "./api.js";

const $ = (id) => document.getElementById(id);
const section = document.querySelector("[data-testid=sweeps]");
const experiment = Number(section.dataset.experiment);

async function list() {
  try {
    const sweeps = results(await api("/api/sweeps", { params: { experiment, limit: 50 } }));
    $("sweep-list").replaceChildren(...(sweeps.length ? sweeps.map((s) => el("li", {},
      el("a", { href: `/sweeps/${s.id}/` }, s.name), " ",
      el("span", { class: `badge ${s.state === "finished" ? "succeeded" : s.state}` }, s.state),
      el("span", { class: "muted" }, ` ${s.method}, ${s.max_runs} runs, ${s.goal} ${s.metric}`)))
      : [el("li", { class: "muted" }, "No sweeps yet.")]));
  } catch { /* the list is a convenience; the page works without it */ }
}

/** The form's body; a search space that is not JSON is reported at its field before any request. */
export function sweepBody(form) {
  const body = {
    experiment,
    method: form.method.value,
    metric: form.metric.value.trim(),
    goal: form.goal.value,
    summary: form.summary.value,
    max_concurrent: Number(form.max_concurrent.value || 1),
  };
  if (form.max_runs.value) body.max_runs = Number(form.max_runs.value);
  if ($("sweep-early").checked) body.early_stopping = { min_steps: Number($("sweep-min-steps").value || 0) };
  try {
    body.search_space = JSON.parse(form.search_space.value);
  } catch (err) {
    return { error: { search_space: [`not JSON: ${err.message}`] } };
  }
  return { body };
}

const form = $("sweep-form");
if (form) {
  $("sweep-new-toggle").addEventListener("click", () => { form.hidden = !form.hidden; });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const box = $("sweep-form-error");
    box.hidden = true;
    const { body, error } = sweepBody(form);
    let errors = error;
    if (body) {
      try {
        const sweep = await api("/api/sweeps", { method: "POST", body });
        window.location.href = `/sweeps/${sweep.id}/`;
        return;
      } catch (err) {
        errors = Object.keys(err.fieldErrors || {}).length ? err.fieldErrors : { "": [err.message] };
      }
    }
    box.replaceChildren(...Object.entries(errors).map(([k, v]) => el("div", { dataset: { field: k } },
      k ? `${k}: ${v.join(" ")}` : v.join(" "))));
    box.hidden = false;
  });
}
list();
