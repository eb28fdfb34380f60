// A project's webhooks on its settings page (owners; docs/dashboard.md, "Project settings"): list them
// with their latest delivery, add one (the API checks the URL: its 400 is shown at the field), enable,
// disable or delete one, and show a webhook's recent deliveries. Everything goes through /api/webhooks.
// URLs and errors are written as text, never as HTML.

import { ApiError, api, el, fmtTime, pageData, results } from "./api.js";

const data = pageData("page-data");
const rowsBox = document.getElementById("webhook-rows");
const table = document.getElementById("webhook-table");
const empty = document.getElementById("webhooks-empty");
const pageError = document.getElementById("webhooks-error");
const form = document.getElementById("webhook-form");
const secretBox = document.getElementById("webhook-secret");
const DELIVERIES_SHOWN = 20;
const open = new Set(); // webhook ids whose deliveries are shown

function showPageError(message) {
  pageError.textContent = message || "";
  pageError.hidden = !message;
}

function statusBadge(status) {
  const cls = { succeeded: "succeeded", failed: "failed", refused: "failed", retrying: "starting",
                sending: "running", pending: "queued" }[status] || "";
  return el("span", { class: `badge ${cls}`, "data-testid": "delivery-status" }, status);
}

function lastDelivery(hook) {
  const d = hook.last_delivery;
  if (!d) return el("span", { class: "muted" }, "none yet");
  return el("span", {}, statusBadge(d.status),
    el("span", { class: "small muted" },
      ` ${d.attempts} attempt${d.attempts === 1 ? "" : "s"}${d.status_code ? `, HTTP ${d.status_code}` : ""}, ${fmtTime(d.updated)}`));
}

async function act(button, fn) {
  button.disabled = true;
  showPageError("");
  try {
    await fn();
    await load();
  } catch (err) {
    showPageError(err instanceof ApiError ? err.message : String(err));
    button.disabled = false;
  }
}

function deliveriesRow(hook) {
  const cell = el("td", { colspan: 5 }, el("span", { class: "muted small" }, "Loading deliveries…"));
  const tr = el("tr", { class: "deliveries", "data-testid": "webhook-deliveries", "data-webhook-id": hook.id }, cell);
  api(`/api/webhooks/${hook.id}/deliveries`, { params: { limit: DELIVERIES_SHOWN } }).then((page) => {
    const items = results(page);
    if (!items.length) {
      cell.replaceChildren(el("p", { class: "empty" }, "No deliveries yet."));
      return;
    }
    cell.replaceChildren(el("table", { class: "list small" },
      el("thead", {}, el("tr", {}, ["Created", "Alert", "Status", "Attempts", "Response", "Last error", "Delivered"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, items.map((d) => el("tr", { "data-testid": "delivery", "data-delivery-id": d.delivery_id },
        el("td", {}, fmtTime(d.created)),
        el("td", {}, `#${d.alert}`),
        el("td", {}, statusBadge(d.status)),
        el("td", { "data-field": "attempts" }, d.attempts),
        el("td", {}, d.status_code ?? "–"),
        el("td", { class: "small mono wrap" }, d.last_error || "–"),
        el("td", {}, d.delivered_at ? fmtTime(d.delivered_at) : "–"))))));
  }).catch((err) => cell.replaceChildren(el("span", { class: "error-text" }, err.message)));
  return tr;
}

function render(hooks) {
  table.hidden = hooks.length === 0;
  empty.hidden = hooks.length !== 0;
  const rows = [];
  for (const hook of hooks) {
    const toggle = el("button", { class: "btn small", type: "button", "data-testid": "webhook-toggle" },
      hook.active ? "Disable" : "Enable");
    toggle.addEventListener("click", () => act(toggle, () =>
      api(`/api/webhooks/${hook.id}`, { method: "PATCH", body: { active: !hook.active } })));
    const remove = el("button", { class: "btn small danger", type: "button", "data-testid": "webhook-delete" }, "Delete");
    remove.addEventListener("click", () => {
      if (!window.confirm(`Delete the webhook to ${hook.url}? Its delivery log goes with it.`)) return;
      open.delete(hook.id);
      act(remove, () => api(`/api/webhooks/${hook.id}`, { method: "DELETE" }));
    });
    const shown = open.has(hook.id);
    const log = el("button", { class: "btn small", type: "button", "data-testid": "webhook-log",
                               "aria-expanded": shown ? "true" : "false" }, shown ? "Hide deliveries" : "Deliveries");
    log.addEventListener("click", () => {
      if (open.has(hook.id)) open.delete(hook.id); else open.add(hook.id);
      render(hooks);
    });
    rows.push(el("tr", { "data-testid": "webhook", "data-webhook-id": hook.id, "data-active": hook.active },
      el("td", { class: "mono wrap", "data-field": "url" }, hook.url),
      el("td", { "data-field": "events" }, hook.events.length ? hook.events.join(", ") : "all"),
      el("td", {}, el("span", { class: `badge ${hook.active ? "succeeded" : "cancelled"}`, "data-field": "active" },
        hook.active ? "active" : "disabled")),
      el("td", { "data-field": "last-delivery" }, lastDelivery(hook)),
      el("td", { class: "nowrap" }, log, " ", toggle, " ", remove)));
    if (shown) rows.push(deliveriesRow(hook));
  }
  rowsBox.replaceChildren(...rows);
}

async function load() {
  try {
    const page = await api("/api/webhooks", { params: { project: data.project, limit: 200 } });
    render(results(page));
  } catch (err) {
    showPageError(`Could not load the webhooks: ${err.message}`);
  }
}

function showFieldErrors(errors) {
  for (const box of form.querySelectorAll("[data-error-for]")) {
    const key = box.dataset.errorFor;
    const messages = Object.entries(errors).filter(([path]) =>
      key ? path === key || path.startsWith(`${key}.`) || path.startsWith(`${key}[`)
          : !["url", "events"].some((k) => path === k || path.startsWith(`${k}.`) || path.startsWith(`${k}[`)));
    box.textContent = messages.map(([, msgs]) => msgs.join(" ")).join(" ");
    box.hidden = !box.textContent;
    form.querySelector(`[name=${key || "__none"}]`)?.closest("label")?.classList.toggle("has-error", !box.hidden);
  }
}

function setupForm() {
  const events = document.getElementById("webhook-events");
  events.replaceChildren(...data.events.map((e) => el("label", { class: "inline" },
    el("input", { type: "checkbox", name: "events", value: e.value, "data-testid": `webhook-event-${e.value}` }),
    ` ${e.label}`)));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = form.querySelector("[type=submit]");
    const body = {
      project: data.project,
      url: form.elements.url.value.trim(),
      events: [...form.querySelectorAll("input[name=events]:checked")].map((c) => c.value),
    };
    button.disabled = true;
    showFieldErrors({});
    secretBox.hidden = true;
    try {
      const hook = await api("/api/webhooks", { method: "POST", body });
      form.reset();
      secretBox.replaceChildren(
        el("b", {}, "Webhook added. "), "Its signing secret is shown this once: ",
        el("code", { "data-testid": "webhook-secret-value" }, hook.secret),
        el("span", { class: "small" }, " — verify X-RLP-Signature with it (HMAC-SHA256 of “<X-RLP-Timestamp>.<body>”)."));
      secretBox.hidden = false;
      await load();
    } catch (err) {
      if (err instanceof ApiError && err.status === 400) showFieldErrors(err.fieldErrors);
      else showFieldErrors({ "": [err.message] });
    } finally {
      button.disabled = false;
    }
  });
}

setupForm();
load();
